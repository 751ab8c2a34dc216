"""The control plane must import with torch and triton unavailable (it is tested in milliseconds)."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

BLOCKER = """
import importlib, pkgutil, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('torch', 'triton'):
            raise ImportError('control plane imported ' + name)
        return None
sys.meta_path.insert(0, Block())
import atom.model_engine as pkg
names = ['atom.config', 'atom.envs', 'atom.bench.capacity', 'atom.models.deepseek_v4.config']
names += [m.name for m in pkgutil.iter_modules(pkg.__path__, 'atom.model_engine.')]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_control_plane_module_imports_with_torch_and_triton_blocked():
    out = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 8
