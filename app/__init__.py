"""LLM inference sizing service."""

from app.compiled import install_guard

# Before any core module is imported: a compiled module whose .py has changed since the build runs as its
# .py, never as the old extension (app/compiled.py).
install_guard()
