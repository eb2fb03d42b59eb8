"""pdscope: prefill and decode, measured on your server and set beside your hardware's ceiling."""

__version__ = "0.1.0"
