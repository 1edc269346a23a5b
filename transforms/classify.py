"""The classes of unresolved half records (spec section 5) and the effect on their counter."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T

from schemas.outputs import CHECK, DISCARD_CHECK_MAX, DISCARD_EXPIRED, IMMUNE, TOO_YOUNG
from transforms.params import RoundParams
from transforms.parsing import parse_java_long

# T - born can overflow a long for garbage born times; compare ages exactly in decimal.
_EXACT = T.DecimalType(21, 0)
# Largest |seconds| whose product with 1000 still fits in a signed 64-bit long.
_MAX_IMMUNITY_SECONDS = (2**63 - 1) // 1000
_NO_IMMUNITY = -1  # the broker's "not set" value: means transactionTimeOut


def exact_age(params: RoundParams) -> Column:
    """``T - born_timestamp_ms`` without overflow (decimal)."""
    return F.lit(params.as_of_ms).cast(_EXACT) - F.col("born_timestamp_ms").cast(_EXACT)


def effective_immunity_ms(params: RoundParams) -> Column:
    """``CHECK_IMMUNITY_TIME_IN_SECONDS`` × 1000 when it parses, is not -1 and fits in 64
    bits; otherwise the transaction timeout (also when absent). No lower bound: "0" is 0 ms."""
    seconds = parse_java_long(F.col("immunity_raw"))
    usable = (
        seconds.isNotNull()
        & (seconds != _NO_IMMUNITY)
        & seconds.between(-_MAX_IMMUNITY_SECONDS, _MAX_IMMUNITY_SECONDS)
    )
    return F.when(usable, seconds * 1000).otherwise(
        F.lit(params.transaction_timeout_ms).cast("long")
    )


def reached_check_max(params: RoundParams) -> Column:
    return F.col("check_times").isNotNull() & (F.col("check_times") >= params.check_max)


def is_expired(params: RoundParams) -> Column:
    return exact_age(params) > F.lit(params.reserved_ms)


def is_immune(params: RoundParams) -> Column:
    return F.col("immunity_raw").isNotNull() & (exact_age(params) < F.col("immunity_ms"))


def is_too_young(params: RoundParams) -> Column:
    """No immunity property, born within the timeout and not in the future (clock skew:
    a negative age is checked, like the broker's ``age <= -1`` clause)."""
    age = exact_age(params)
    return (
        F.col("immunity_raw").isNull() & (age >= 0) & (age < F.lit(params.transaction_timeout_ms))
    )


def round_class(params: RoundParams) -> Column:
    """The first class of the table in spec section 5 that applies."""
    return (
        F.when(reached_check_max(params), DISCARD_CHECK_MAX)
        .when(is_expired(params), DISCARD_EXPIRED)
        .when(is_immune(params), IMMUNE)
        .when(is_too_young(params), TOO_YOUNG)
        .otherwise(CHECK)
    )


def with_round_class(candidates: DataFrame, params: RoundParams) -> DataFrame:
    """Add ``immunity_ms``, ``age_ms`` (null if it does not fit a long) and ``round_class``."""
    return (
        candidates.withColumn("immunity_ms", effective_immunity_ms(params))
        .withColumn("age_ms", exact_age(params).try_cast(T.LongType()))
        .withColumn("round_class", round_class(params))
    )


def counter_after(status: Column) -> Column:
    """The counter after this round's effect: put-backs and the expiry discard carry
    ``check_times + 1`` (1 when absent); a check-max discard, a too-young record and a
    record not reached keep the stored value."""
    incremented = (F.coalesce(F.col("check_times"), F.lit(0)) + 1).cast(T.IntegerType())
    return F.when(status.isin(CHECK, IMMUNE, DISCARD_EXPIRED), incremented).otherwise(
        F.col("check_times")
    )
