"""The process that runs the user's ``model_fn`` cannot read the training data (Linux Landlock).

Why: ``model_fn`` chooses the architecture, and every number in it — a layer size, an
initializer's value, a scale — reaches the published model. If the process that runs it could
read the granted examples, those numbers could carry them (a mean label as a constant bias, a
row per layer width). So the child process restricts itself before it imports the module, with
Landlock (an unprivileged Linux LSM, kernel ≥ 5.13), to:

* read (and execute): the Python installation and its packages (``sys.prefix``,
  ``sys.base_prefix``, site-packages, the packages' own directories), the system's libraries and
  configuration (``/usr``, ``/lib*``, ``/bin``, ``/etc``), ``/dev``, its own ``/proc`` entry and
  the CPU / memory facts TensorFlow reads, the module file, the transform graph (a released DP
  output) and the schema;
* write: its own temporary directory (the request and the response), ``/dev/null`` and the like;
* no TCP connection or bind (Landlock ABI ≥ 4): no ledger, no database, no remote store;
  abstract UNIX sockets and signals outside its domain are scoped out too (ABI ≥ 6).

Its environment keeps no ledger URL, token, key provider or database settings. The examples,
the block storage, the ledger's database and the key-encryption key are all outside what it can
read. Where Landlock is unavailable (an older kernel, a sandbox that forbids it),
:func:`restrict` returns 0 and the caller records that the module ran without isolation.
"""
from __future__ import annotations

import ctypes
import os
import site
import sys
from typing import Iterable

_SYS_CREATE_RULESET, _SYS_ADD_RULE, _SYS_RESTRICT_SELF = 444, 445, 446  # every architecture
_PR_SET_NO_NEW_PRIVS = 38
_RULE_PATH_BENEATH = 1
_CREATE_RULESET_VERSION = 1

# Filesystem rights by ABI version (include/uapi/linux/landlock.h).
_EXECUTE, _WRITE_FILE, _READ_FILE, _READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_FS_V1 = (1 << 13) - 1          # EXECUTE .. MAKE_SYM
_REFER, _TRUNCATE, _IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
_READ = _EXECUTE | _READ_FILE | _READ_DIR
_NET_BIND_TCP, _NET_CONNECT_TCP = 1 << 0, 1 << 1
_SCOPE_ABSTRACT_UNIX, _SCOPE_SIGNAL = 1 << 0, 1 << 1

# Devices a Python process writes to (never a file).
WRITABLE_DEVICES = ("/dev/null", "/dev/zero", "/dev/tty", "/dev/shm")
# Environment variables the child never sees (credentials, ledger and key locations).
SECRET_ENV_PREFIXES = ("SAGE_", "PG", "AIRFLOW_CONN_", "GOOGLE_APPLICATION_CREDENTIALS", "AWS_")


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def landlock_abi() -> int:
    """The kernel's Landlock ABI version (0: not available)."""
    if not sys.platform.startswith("linux"):
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    version = libc.syscall(_SYS_CREATE_RULESET, None, ctypes.c_size_t(0),
                           ctypes.c_uint32(_CREATE_RULESET_VERSION))
    return max(0, int(version))


def _fs_rights(abi: int) -> int:
    rights = _FS_V1
    if abi >= 2:
        rights |= _REFER
    if abi >= 3:
        rights |= _TRUNCATE
    if abi >= 5:
        rights |= _IOCTL_DEV
    return rights


def default_read_paths() -> list:
    """What a Python + TensorFlow process needs to read (module doc)."""
    paths = {sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(sys.executable),
             os.path.realpath(sys.executable)}
    paths.update(site.getsitepackages())
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    for name in ("sage_tfx", "sage_tfx.components", "sage_tfx.pipelines"):
        paths.update(package_dirs(name))
    paths.update(["/usr", "/lib", "/lib32", "/lib64", "/bin", "/sbin", "/etc", "/dev",
                  f"/proc/{os.getpid()}", "/proc/cpuinfo", "/proc/meminfo", "/proc/stat",
                  "/proc/sys/vm/overcommit_memory", "/sys/devices/system/cpu",
                  "/sys/fs/cgroup"])
    return sorted(p for p in paths if p and os.path.exists(p))


def package_dirs(name: str) -> list:
    """Where the package (or module) ``name`` lives, found without importing it (its parents
    are imported: pass a top-level name for code that must not run)."""
    import importlib.util
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return list(spec.submodule_search_locations)
    return [spec.origin] if spec.origin and os.path.exists(spec.origin) else []


def clean_environment(env: dict) -> dict:
    """``env`` without credentials and ledger / key settings (:data:`SECRET_ENV_PREFIXES`)."""
    return {k: v for k, v in env.items() if not k.startswith(SECRET_ENV_PREFIXES)}


def restrict(read_paths: Iterable[str], write_paths: Iterable[str]) -> int:
    """Restricts this process (and its future children) to the paths given, with no TCP.

    Returns:
      The Landlock ABI enforced, or 0 if Landlock is not available (nothing restricted).

    Raises:
      OSError: Landlock is available but the ruleset could not be built or enforced.
    """
    abi = landlock_abi()
    if abi < 1:
        return 0
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    fs = _fs_rights(abi)
    attr = _RulesetAttr(handled_access_fs=fs,
                        handled_access_net=(_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0,
                        scoped=(_SCOPE_ABSTRACT_UNIX | _SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 8 if abi < 4 else (16 if abi < 6 else 24)
    ruleset = libc.syscall(_SYS_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size),
                           ctypes.c_uint32(0))
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    try:
        for paths, access in ((read_paths, _READ), (write_paths, fs)):
            for path in paths:
                _allow(libc, ruleset, path, access, fs)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")
        if libc.syscall(_SYS_RESTRICT_SELF, ctypes.c_int(ruleset), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    finally:
        os.close(ruleset)
    return abi


def _allow(libc, ruleset: int, path: str, access: int, fs: int) -> None:
    try:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
    except OSError:
        return  # a path that does not exist grants nothing
    try:
        if not os.path.isdir(path):  # files take file rights only
            access &= _EXECUTE | _READ_FILE | _WRITE_FILE | (fs & (_TRUNCATE | _IOCTL_DEV))
        rule = _PathBeneathAttr(allowed_access=access & fs, parent_fd=fd)
        if libc.syscall(_SYS_ADD_RULE, ctypes.c_int(ruleset), ctypes.c_int(_RULE_PATH_BENEATH),
                        ctypes.byref(rule), ctypes.c_uint32(0)) != 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
    finally:
        os.close(fd)
