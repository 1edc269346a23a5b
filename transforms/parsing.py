"""Column helpers that parse text the way the broker's Java code does.

Numbers in op bodies and properties are parsed like ``Long.parseLong`` /
``Integer.parseInt`` (spec section 4): an optional sign, ASCII digits only, no spaces,
within range. Spark's own cast is more lenient (it trims white space and accepts
``1.5``), so a strict pattern guards it; ``try_cast`` then rejects out-of-range values
with a null instead of failing the job under ANSI mode.
"""

from __future__ import annotations

from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql import types as T

# \A and \z: whole string; `$` alone would also accept a trailing newline.
JAVA_INTEGER_TEXT = r"\A[+-]?[0-9]+\z"


def is_java_integer_text(text: Column) -> Column:
    """True when ``text`` has the shape Java's integer parsers accept (range not checked)."""
    return text.rlike(JAVA_INTEGER_TEXT)


def parse_java_long(text: Column) -> Column:
    """``Long.parseLong(text)``, or null when it would throw (null in, null out)."""
    return F.when(is_java_integer_text(text), text.try_cast(T.LongType()))


def parse_java_int(text: Column) -> Column:
    """``Integer.parseInt(text)``, or null when it would throw (null in, null out)."""
    return F.when(is_java_integer_text(text), text.try_cast(T.IntegerType()))


def is_unparsable(raw: Column, parsed: Column) -> Column:
    """A value is present but could not be parsed (treated as absent; a bad record, or for
    the immunity property a finding: ``transforms.bad_records``)."""
    return raw.isNotNull() & parsed.isNull()


def nonempty(text: Column) -> Column:
    """Null for an empty string: a property with an empty value does not exist (spec section 2)."""
    return F.when(text != "", text)
