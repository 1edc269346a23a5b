"""The operator columns of check_requests, discards and pending (spec section 6): what an
on-call engineer searches by (keys, tags, transaction id, producer instance) and acts on
(checks left, the earliest discard if nobody answers), with UTC timestamps beside the
epoch-ms columns. Pure column expressions; no UDF.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.outputs import CHECK, DISCARD_CHECK_MAX, DISCARD_EXPIRED, IMMUNE
from transforms.classify import exact_age
from transforms.messages import QUEUE_KEY
from transforms.params import RoundParams
from transforms.queue_values import Attach, joined_values

KEY_SEPARATOR = " "  # MessageConst.KEY_SEPARATOR: KEYS holds several keys, space-separated
# The instants a Spark/Delta timestamp holds (years 1 to 9999); a garbage time outside
# them has no timestamp (null) rather than failing the run.
_MIN_MS = -62_135_596_800_000
_MAX_MS = 253_402_300_799_999
_EXACT = T.DecimalType(38, 0)


def message_keys(keys_raw: Column) -> Column:
    """KEYS split on spaces, empty items dropped; an empty array when there is no KEYS."""
    items = F.split(F.coalesce(keys_raw, F.lit("")), KEY_SEPARATOR)
    return F.filter(items, lambda key: key != "")


def utc_timestamp(epoch_ms: Column) -> Column:
    """The instant of an epoch-ms column as a TimestampType (null outside years 1-9999)."""
    return F.when(epoch_ms.between(_MIN_MS, _MAX_MS), F.timestamp_millis(epoch_ms))


def is_discarded() -> Column:
    return F.col("status").isin(DISCARD_CHECK_MAX, DISCARD_EXPIRED)


def checks_left(params: RoundParams) -> Column:
    """max(0, check_max - counter after this round); immune put-backs use checks up too. A
    discarded record gets no check any more: 0."""
    used = F.coalesce(F.col("counter_after"), F.lit(0)).cast(T.LongType())
    left = F.greatest(F.lit(params.check_max).cast(T.LongType()) - used, F.lit(0))
    # try_cast: a garbage counter (e.g. -2^31) leaves more checks than an int holds: null.
    return F.when(is_discarded(), F.lit(0)).otherwise(left).try_cast(T.IntegerType())


def copy_reached_this_round(params: RoundParams) -> Column:
    """Whether the broker reaches this record's put-back copy in the same round: the loop
    did not stop (no too-young record) and every copy appended before it is also discarded
    on sight (counter at the maximum), so no fresh copy stops the loop first (the discard
    test comes before the freshness test; docs/broker-check.md)."""
    put_back = F.col("status").isin(CHECK, IMMUNE)
    at_max = F.col("counter_after") >= F.lit(params.check_max)
    before_live_copy = F.col("first_live_copy").isNull() | (
        F.col("queue_offset") < F.col("first_live_copy")
    )
    return put_back & at_max & (F.col("stopped_at").isNull()) & before_live_copy


def discard_at_ms(params: RoundParams, copy_reached: Column | None = None) -> Column:
    """The earliest time the broker discards the record if nobody answers.

    Discard rows: T. Otherwise, with c the counter after this round (the stored counter
    for too_young / not_reached; null = 0), by count the round T + (check_max - c + 1) x
    interval (at least the next round; a null counter at least the round after), or T
    when c reached the maximum and the copy is
    reached this round; by age the first round after born + retention; whichever is
    earlier. "Earliest": a real round period is the interval plus the round's run time.
    ``copy_reached``: whether the round reaches the record's copy (the broker's walk knows;
    by default ``copy_reached_this_round``, from the job's round).
    """
    as_of = F.lit(params.as_of_ms).cast(_EXACT)
    interval = F.lit(params.check_interval_ms).cast(_EXACT)
    check_max = F.lit(params.check_max).cast(_EXACT)
    counter = F.col("counter_after").cast(_EXACT)
    # A record without a counter (too young or not reached) is not compared with the
    # maximum the first time the broker reaches it (it gets counter 1): null = 0, except
    # that even check_max 0 discards it only the round after.
    by_count = F.when(counter.isNull(), F.greatest(check_max + 1, F.lit(2))).otherwise(
        F.greatest(check_max - counter + 1, F.lit(1))
    )
    reached = copy_reached_this_round(params) if copy_reached is None else copy_reached
    rounds_by_count = F.when(reached, F.lit(0)).otherwise(by_count)
    # The first k >= 1 with T + k x interval - born > retention.
    to_expiry = F.lit(params.reserved_ms).cast(_EXACT) - exact_age(params)
    # floor(to_expiry / interval) exactly: subtracting the remainder first makes the
    # division exact (a decimal division rounds to a few digits, which floor would
    # then carry to the wrong integer for a long interval).
    whole_rounds = (to_expiry - F.pmod(to_expiry, interval)) / interval
    rounds_by_age = F.greatest(whole_rounds.cast(_EXACT) + 1, F.lit(1)).cast(_EXACT)
    forecast = as_of + F.least(rounds_by_count, rounds_by_age) * interval
    return (
        F.when(is_discarded(), as_of)
        .otherwise(forecast)
        .try_cast(T.LongType())  # beyond a long (garbage born times): unknown
    )


def with_queue_round_facts(
    pending: DataFrame, queues: DataFrame, attach: Attach = joined_values
) -> DataFrame:
    """Add the per-queue facts the forecast reads: ``stopped_at`` (the too-young offset,
    null when the round did not stop) and ``first_live_copy`` (the first put-back whose
    copy is not discarded on sight). Every pending record's queue has a row in ``queues``
    (its h1 was attached from it), so ``attach`` (the caller's: a literal map for a few
    queues, costing no Spark job) keeps every record."""
    return attach(pending, queues, ["stopped_at", "first_live_copy"])


def past_last_check(params: RoundParams) -> Column:
    """A check row whose counter after this round reached ``check_max``: the producer's
    answer to this check is the last chance; nobody asks again."""
    return (F.col("status") == CHECK) & (F.col("counter_after") >= F.lit(params.check_max))


def attention_counts(pending: DataFrame, params: RoundParams) -> DataFrame:
    """Per queue, what an operator looks at first: ``discard_next_round`` (records not
    discarded yet that the next round, at T + interval at the earliest, discards if nobody
    answers; copies the broker discards later in this same round included) and
    ``past_last_check``. ``pending`` carries ``with_queue_round_facts``."""
    horizon = F.lit(params.as_of_ms + params.check_interval_ms)
    next_round = ~is_discarded() & (discard_at_ms(params) <= horizon)
    return pending.groupBy(*QUEUE_KEY).agg(
        F.count(F.when(next_round, 1)).alias("discard_next_round"),
        F.count(F.when(past_last_check(params), 1)).alias("past_last_check"),
    )
