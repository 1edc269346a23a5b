"""Checks of the code itself that ruff, mypy and pylint do not make (run by ``make lint``)."""
