"""The oracle predictor's input on a live cluster: the true output length, in a request header.

Controlled studies (the paper's predictor-noise experiment) need the true length with a known error added.
A simulator has it; a proxy does not, so the live load generator, which chose each request's length, sends
it in ``ORACLE_HEADER``. Only a proxy started with ``--predictor oracle`` reads it, and there it is required.
It is never ``max_tokens``: a client's cap is not its answer's length.
"""

from __future__ import annotations

ORACLE_HEADER = "x-calroute-oracle-output-tokens"


def oracle_tokens(value: str | None) -> int | None:
    """The header's value as a positive token count, or None when it is missing or not one."""
    # ASCII digits only: str.isdigit takes "²" too, which int() refuses; and few enough that int() reads
    # them (it refuses more than 4300 digits) and the count fits 64 bits.
    if value is None or not value.isascii() or not value.isdigit() or len(value) > 18:
        return None
    n = int(value)
    return n if n >= 1 else None
