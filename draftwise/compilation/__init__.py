"""Compiling the target's forward: ``CompilationConfig`` (vLLM's keys) and ``CompiledForward``."""
from .compiled_forward import CompiledForward
from .config import CompilationConfig

__all__ = ["CompilationConfig", "CompiledForward"]
