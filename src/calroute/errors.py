"""calroute's exception hierarchy.

* CalrouteError
  - ConfigError: a bad policy name or parameter, a bad profile, a bad CLI or file value
  - NoCandidateError: a pool has no healthy instance to route to
  - TraceFormatError: a trace file that matches none of the supported formats, with the line at fault
  - CalibrationError: a calibration file that cannot be read or fitted
"""

from __future__ import annotations


class CalrouteError(Exception):
    """Base of every error calroute raises on purpose."""


class ConfigError(CalrouteError, ValueError):
    pass


class NoCandidateError(CalrouteError):
    pass


class TraceFormatError(CalrouteError, ValueError):
    pass


class CalibrationError(CalrouteError, ValueError):
    pass
