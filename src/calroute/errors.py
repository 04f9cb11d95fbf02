"""calroute's exception tree: every exception class in the package derives from CalrouteError, and is
listed here (tests/test_errors.py checks both).

* CalrouteError
  - ConfigError: a bad policy name or parameter, a bad profile, a bad CLI or file value
  - NoCandidateError: a pool has no healthy instance to route to
  - TraceFormatError: a trace file that matches none of the supported formats, with the line at fault
  - CalibrationError: a calibration file that cannot be read or fitted
  - cluster: EngineStartError, EngineStopError (procs.py: a process group that would not start or stop)
  - contract: BadMessage (kv_events.py, also a ValueError: a KV-event message the subscriber will not apply,
    with its kind), TokenizeError (tokenizer.py, also a ValueError: a prompt a tokenizer cannot read),
    TokenizerUnavailable (tokenizer.py: a tokenizer that could not answer, an engine's /tokenize gone)
  - tokenizer: _Unreadable (template.py: a chat template whose content loops cannot be followed)
  - emulator: ApiError (api.py: a request the emulator refuses, with vLLM's status and body); PullFailed
    (request.py: a KV pull the prefill engine could not serve)
  - calibrate: RequestFailed (client.py: one measurement request failed), and its NoSteadyWindow (a batch
    never ran whole)
  - harness: GateFailed (gates.py: the correctness gates, each result), _EngineError (gates.py: an engine
    answered, but not as a gate requires); LiveRunError (live.py: a live run could not be made)
  - proxy: EngineFailed (errors.py: an engine failed before any output reached the client: retry);
    ClientGone (errors.py, also a ConnectionResetError: the client left mid-stream)
  - proxy/http: UpstreamError (answer.py: an engine unreachable, breaking off, or answering HTTP the
    client does not read), and its ProtocolError (answer.py: an answer misframed or over its cap, with
    its kind); UnsafeRequest (client.py, also a ValueError: a request to an engine with CR, LF or NUL in
    a line, never sent); FramingError (framing.py, also a ValueError: bytes that are not HTTP/1.1
    framing); ClosedEarly (connection.py, also an EOFError: closed before a whole head), _Beyond
    (connection.py: bytes after the end of an answer); HeadTooLarge (head.py, also a ValueError);
    _Refusal (reader.py: a request answered with an error, after which the connection reads nothing);
    ScrapeError (scrape.py: a /metrics or /health poll that got no usable answer)

The stdlib bases kept beside CalrouteError are the ones callers catch (ValueError for bad values, the
connection errors the event loop's code expects).
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
