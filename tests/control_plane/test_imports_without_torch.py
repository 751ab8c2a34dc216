"""The control plane must import with torch and triton unavailable (it is tested in milliseconds): the KV
memory, the step loop, the output side, and the pure modules of speculative decoding and testing."""

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
names = ['atom.config', 'atom.envs', 'atom.bench.capacity', 'atom.models.deepseek_v4.config', 'atom.step_contract',
         'atom.spec_decode.draft_source', 'atom.spec_decode.spec_counters', 'atom.testing.replay_draft',
         'atom.testing.fake_runner', 'atom.testing.kv_content_model']
for pkg_name in ('atom.kv', 'atom.model_engine', 'atom.output'):
    pkg = importlib.import_module(pkg_name)
    names += [m.name for m in pkgutil.iter_modules(pkg.__path__, pkg_name + '.')]
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_control_plane_module_imports_with_torch_and_triton_blocked():
    out = subprocess.run([sys.executable, "-c", BLOCKER], cwd=ROOT, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert int(out.stdout.strip()) >= 8
