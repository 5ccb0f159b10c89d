"""The DOCKER-environment path of the image, as far as a machine without a Docker daemon allows.

The image's filesystem is assembled from the Dockerfile's final stage in a temporary root: the
pipeline virtualenv (a real one, with pip) where ``COPY --from=build`` puts it, owned as its
``--chown`` says (root without one), the Beam directory root-owned, and the environment its
``ENV`` lines set. Then, as the ``USER`` the image runs as (``setpriv``, uid 1000), the two
environment steps Beam's SDK boot program takes before it starts the worker
(``sdks/python/container/boot.go``: since Beam 2.44 it creates a virtualenv under
``/opt/apache/beam-venv`` for the worker, since 2.48 not when
``RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT`` is set; then it pip-installs the staged files, here a
TFX module wheel, with the ``python`` of that environment). The worker virtualenv step is checked
as creating its directory, where it fails for uid 1000.
The same steps in the layout the Dockerfile had before (no variable, a root-owned virtualenv)
fail: the checks can fail. Not run: the boot binary itself (it is not on PyPI or in this repo).
"""
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

import dockerfile
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VENV, BEAM = "/opt/venv", "/opt/apache/beam"

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="assembling the layout needs root and setpriv")


def _final_stage():
    stages = []
    for c in dockerfile.parse_file(os.path.join(ROOT, "Dockerfile")):
        if c.cmd == "FROM":
            stages.append([])
        elif stages:
            stages[-1].append(c)
    return stages[-1]


def _image(final):
    """(env, uid, gid, owner of /opt/venv) the final stage sets up."""
    env, owner, user = {}, (0, 0), None
    for c in final:
        if c.cmd == "ENV":
            pairs = list(c.value)
            for key, value in zip(pairs[::2], pairs[1::2]):
                env[key] = value
        elif c.cmd == "COPY" and list(c.value) == [VENV, VENV]:
            chown = [f for f in c.flags if f.startswith("--chown=")]
            if chown:
                u, _, g = chown[0][len("--chown="):].partition(":")
                owner = (int(u), int(g or u))
        elif c.cmd == "USER":
            user = c.value[0]
    uid, _, gid = user.partition(":")
    return env, int(uid), int(gid or uid), owner


def _wheel(directory):
    """A TFX-module-like wheel to stage: one module, built by hand (no build backend)."""
    path = os.path.join(directory, "dnd_module-0.1-py3-none-any.whl")
    info = "dnd_module-0.1.dist-info"
    files = {"dnd_module.py": "RUN_FN = 'ok'\n",
             f"{info}/METADATA": "Metadata-Version: 2.1\nName: dnd-module\nVersion: 0.1\n",
             f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              "Tag: py3-none-any\n"}
    with zipfile.ZipFile(path, "w") as z:
        for name, text in files.items():
            z.writestr(name, text)
        z.writestr(f"{info}/RECORD", "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n")
    return path


def _assemble(root, owner):
    """/opt/venv (owned ``owner``) and a root-owned /opt/apache/beam under ``root``."""
    venv = root + VENV
    # the base image's interpreter is world-readable (/usr/local); this test's may live in
    # root's home, out of uid 1000's reach: take the system one when there is one
    base = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    subprocess.run([base, "-m", "venv", venv], check=True, timeout=300, capture_output=True)
    for dirpath, dirnames, filenames in os.walk(venv):
        for name in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            os.lchown(name, *owner)
    os.makedirs(root + BEAM)
    for d in (root, root + "/opt", root + "/opt/apache", root + BEAM):
        os.chown(d, 0, 0)
        os.chmod(d, 0o755)


def _boot_steps(root, env, uid, gid, wheel):
    """Beam boot's environment steps as ``uid``: the worker venv unless the variable is set,
    then ``python -m pip install`` of the staged wheel; returns (ok, what failed)."""
    path = env.get("PATH", "").replace("$PATH", "/usr/bin:/bin")
    path = ":".join(root + p if p.startswith("/opt/") else p for p in path.split(":"))
    run_env = {"PATH": path, "HOME": "/tmp", "PIP_NO_CACHE_DIR": env.get("PIP_NO_CACHE_DIR", "1"),
               "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    if env.get("VIRTUAL_ENV"):
        run_env["VIRTUAL_ENV"] = root + env["VIRTUAL_ENV"]
    as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
    python = shutil.which("python", path=path)
    assert python and python.startswith(root + VENV), python  # the image's python comes first
    if not env.get("RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT"):
        venv = root + "/opt/apache/beam-venv/beam-venv-worker-1"
        r = subprocess.run(as_user + ["mkdir", "-p", venv], env=run_env, capture_output=True,
                           timeout=60)
        if r.returncode:
            return False, "worker venv: " + r.stderr.decode()
    r = subprocess.run(as_user + [python, "-m", "pip", "install", "--no-deps", "--no-index",
                                  wheel], env=run_env, capture_output=True, timeout=300)
    if r.returncode:
        return False, "pip install: " + (r.stdout + r.stderr).decode()[-400:]
    r = subprocess.run(as_user + [python, "-c", "import dnd_module; print(dnd_module.RUN_FN)"],
                       env=run_env, capture_output=True, timeout=60)
    return r.stdout.strip() == b"ok", r.stderr.decode()


@pytest.fixture
def tmp_path():
    """A directory uid 1000 can reach (pytest's own is under a root-only 0700 directory)."""
    d = tempfile.mkdtemp(prefix="sage-image-")
    os.chmod(d, 0o755)
    yield pathlib.Path(d)
    shutil.rmtree(d, ignore_errors=True)


def test_boot_runs_in_the_default_environment_and_installs_staged_wheels(tmp_path):
    final = _final_stage()
    env, uid, gid, owner = _image(final)
    assert uid != 0 and env.get("RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT") == "1"
    assert env.get("VIRTUAL_ENV") == VENV and re.match(rf"^{VENV}/bin:", env.get("PATH", ""))
    assert owner == (uid, gid), "the virtualenv belongs to the user the image runs as"
    root = str(tmp_path / "image")
    _assemble(root, owner)
    ok, why = _boot_steps(root, env, uid, gid, _wheel(str(tmp_path)))
    assert ok, why


def test_the_previous_layout_fails_both_steps(tmp_path):
    """No RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT: the worker venv cannot be made as uid 1000;
    with it but a root-owned virtualenv: the staged wheel cannot be installed."""
    env, uid, gid, _ = _image(_final_stage())
    wheel = _wheel(str(tmp_path))
    root = str(tmp_path / "image")
    _assemble(root, (0, 0))
    old = {k: v for k, v in env.items() if k != "RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT"}
    ok, why = _boot_steps(root, old, uid, gid, wheel)
    assert not ok and why.startswith("worker venv")
    ok, why = _boot_steps(root, env, uid, gid, wheel)
    assert not ok and why.startswith("pip install")
