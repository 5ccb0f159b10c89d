"""`import sage_tfx.components` stays cheap: TFX is imported only when a component is used."""
import subprocess
import sys


def test_importing_the_package_does_not_import_tfx():
    code = ("import sys, sage_tfx.components as c\n"
            "assert {'BlockExampleGen', 'SageGate', 'SageGrant'} <= set(c.__all__)\n"
            "print(','.join(m for m in ('tfx', 'tensorflow', 'apache_beam') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == ""
