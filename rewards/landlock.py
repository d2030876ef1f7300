"""Linux Landlock confinement for a child process: after :func:`confiner`'s function runs (in ``preexec_fn``, right
before ``exec``), the process and everything it starts may read only below the given read-only paths, write only
below the given writable paths, open no TCP connection (Landlock ABI >= 4) and signal no process outside itself
(ABI >= 6). No privileges are needed; the kernel enforces it.

Why: kpathsea's ``openin_any=p`` is not a complete boundary. pdfTeX 1.40.24 (TeX Live 2022) reads files for
``\\pdfobj file {...}`` without asking kpathsea, so ``\\pdfobj file {/etc/passwd}`` embeds that file in the PDF even
in paranoid mode (``tests/test_sandbox_security.py`` shows it with Landlock off). Landlock closes that and any other
such hole for every file a TeX run might open.

Why our own code: Python's standard library has no Landlock binding and the PyPI ones are unmaintained; the
interface is three system calls and two structs. On kernels without Landlock :func:`abi` is 0; the rendering sandbox
then refuses to run unless the user opts into unconfined rendering (see :mod:`.sandbox`).

``MMRL_SANDBOX_DISABLE_LANDLOCK=1`` makes :func:`abi` report 0 on a kernel that has Landlock, so that the tests (and a
user checking a deployment) can run everything exactly as on a kernel without it. It can only take protection away,
and the sandbox then fails closed, so it is not a way around the sandbox.
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Callable, Sequence
from functools import lru_cache

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # same numbers on every architecture
_CREATE_RULESET_VERSION = 1
_RULE_PATH_BENEATH = 1
_PR_SET_NO_NEW_PRIVS = 38

_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_TRUNCATE, _IOCTL_DEV = 1 << 14, 1 << 15  # ABI 3, ABI 5
_FILE_RIGHTS = (
    _EXECUTE | _WRITE_FILE | _READ_FILE | _TRUNCATE | _IOCTL_DEV
)  # the rights a rule on a file may hold
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX_SOCKET, _SCOPE_SIGNAL = 1 << 0, 1 << 1


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


DISABLE_ENV = "MMRL_SANDBOX_DISABLE_LANDLOCK"

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


def _fs_rights(abi_version: int) -> int:
    """Every filesystem right this ABI knows: 13 in ABI 1, REFER in 2, TRUNCATE in 3, IOCTL_DEV in 5."""
    return (1 << (13 + (abi_version >= 2) + (abi_version >= 3) + (abi_version >= 5))) - 1


def abi() -> int:
    """The Landlock ABI version to use: the kernel's, 0 when Landlock is unavailable (old kernel, disabled,
    non-Linux) or when ``MMRL_SANDBOX_DISABLE_LANDLOCK=1`` is set (read on every call, so tests can switch it)."""
    return 0 if os.environ.get(DISABLE_ENV) == "1" else kernel_abi()


@lru_cache(maxsize=1)
def kernel_abi() -> int:
    """The kernel's Landlock ABI version, 0 when the kernel offers none (probed once per process)."""
    try:
        version = _libc.syscall(
            _SYS_CREATE_RULESET, None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION)
        )
    except (AttributeError, OSError):
        return 0
    return max(0, int(version))


def confiner(
    read_paths: Sequence[str | os.PathLike], write_paths: Sequence[str | os.PathLike]
) -> Callable[[], None]:
    """A function for ``preexec_fn`` that confines the calling process (see module docstring). Paths that do not
    exist are left out here, in the parent; all structures are built here too, so the child only makes system
    calls. Raises ``OSError`` when Landlock is unavailable (check :func:`abi` first)."""
    version = abi()
    if version < 1:
        raise OSError("Landlock is not available on this kernel")
    fs = _fs_rights(version)
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if version >= 4 else 0
    scoped = (_SCOPE_ABSTRACT_UNIX_SOCKET | _SCOPE_SIGNAL) if version >= 6 else 0
    attr = _RulesetAttr(fs, net, scoped)
    attr_size = 8 if version < 4 else (16 if version < 6 else 24)
    read_dir = _EXECUTE | _READ_FILE | _READ_DIR
    rules = [(os.fsencode(p), read_dir) for p in read_paths if os.path.exists(p)]
    rules += [(os.fsencode(p), fs) for p in write_paths if os.path.exists(p)]
    rules = [(p, rights if os.path.isdir(p) else rights & _FILE_RIGHTS & fs) for p, rights in rules]
    beneath = [_PathBeneathAttr(rights, -1) for _, rights in rules]

    def confine() -> None:
        if _libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        ruleset = _libc.syscall(
            _SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(attr_size), ctypes.c_uint32(0)
        )
        if ruleset < 0:
            raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
        for (path, _), rule in zip(rules, beneath):
            rule.parent_fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            status = _libc.syscall(
                _SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule), 0
            )
            if status != 0:
                raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path!r}")
            os.close(rule.parent_fd)
        if _libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
        os.close(ruleset)

    return confine


__all__ = ["DISABLE_ENV", "abi", "confiner", "kernel_abi"]
