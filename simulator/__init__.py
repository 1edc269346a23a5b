"""The broker simulator and the store writer: test and benchmark tooling, not the job.

``python -m simulator`` writes a simulated broker store (``simulation``, through the
``writer.StoreWriter`` and ``encoding``); ``broker_round`` replays the broker's check round
for the real-broker comparisons. Nothing in the job imports this package, and ``make
package`` leaves it out of the zip sent to clusters.
"""
