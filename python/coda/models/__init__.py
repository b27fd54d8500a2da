"""Models built from CODA blocks: coda.models.llama (a LLaMA causal LM whose state_dict is in Hugging Face layout)."""
from . import llama  # noqa: F401
