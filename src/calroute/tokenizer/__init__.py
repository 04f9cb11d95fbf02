"""The served model's own tokenizer (``HfTokenizer``): the token ids a real vLLM engine prefills for a
request, so that the proxy hashes and prices the blocks the engines cache (contract/tokenizer.py)."""

from calroute.tokenizer.hf import HfTokenizer

__all__ = ["HfTokenizer"]
