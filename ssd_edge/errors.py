"""Typed errors. Every error a user can cause has a one-line message that names
the file or value at fault; the CLI prints it and exits non-zero."""

from __future__ import annotations


class SSDEdgeError(Exception):
    """Base class of every error ssd-edge raises on purpose."""

    exit_code = 1


class ConfigError(SSDEdgeError):
    """A setting is out of range or inconsistent."""

    exit_code = 2


class ModelError(SSDEdgeError):
    """A model file cannot be used."""

    exit_code = 3


class ModelNotFoundError(ModelError):
    """Neither a file on disk nor a catalog name (or the catalog file is not pulled)."""


class NotGGUFError(ModelError):
    """The file does not start with the GGUF magic."""


class CorruptModelError(ModelError):
    """A GGUF file that is truncated or that llama.cpp refuses to load."""


class VocabMismatchError(ModelError):
    """Draft and target do not share a vocabulary, so they cannot be paired."""


class FetchError(SSDEdgeError):
    """A model could not be fetched or assembled (network, package, checksum, disk)."""

    exit_code = 4


class ContextFullError(SSDEdgeError):
    """The prompt (or prompt plus answer) does not fit in the context window."""

    exit_code = 5


class DecodeError(SSDEdgeError):
    """llama_decode returned an error."""

    exit_code = 6


class DraftSideError(DecodeError):
    """SSD's draft side failed or stopped answering during a generation: that generation ends, the
    next one runs (with the draft loaded again where the old one is still held by a hung decode)."""


class RPCError(SSDEdgeError):
    """An RPC server (--rpc) is unreachable at start, or was lost during a generation."""

    exit_code = 7
