"""The module paths from before the subpackages (ascmem.trace_data,
ascmem.cli, ascmem.stream_pools, ...) stay importable: each old name is the
new module itself, not a copy, so `import ascmem.trace_data` and
`import ascmem.trace.data` give one module object -- a monkeypatch through
either name is seen through both, and pickles made under the old names
load."""

import importlib
import importlib.abc
import importlib.util
import sys

# old path -> new path; the only place that knows a module moved
MOVED = {
    "ascmem.acl_allocator": "ascmem.acl.allocator",
    "ascmem.acl_soma": "ascmem.acl.soma",
    "ascmem.stream_pools": "ascmem.acl.stream_pools",
    "ascmem.trace_data": "ascmem.trace.data",
    "ascmem.trace_csv": "ascmem.trace.csvfile",
    "ascmem.trace_import": "ascmem.trace.profiler",
    "ascmem.cli": "ascmem.tools.cli",
    "ascmem.cli_plan": "ascmem.tools.cli_plan",
    "ascmem.planner": "ascmem.tools.planner",
    "ascmem.bench": "ascmem.tools.bench",
    "ascmem.plot": "ascmem.tools.plot",
    "ascmem.progress": "ascmem.tools.progress",
    "ascmem.reference": "ascmem.emulations.reference",
    "ascmem.torch_caching": "ascmem.emulations.torch_caching",
    "ascmem.torch_expandable": "ascmem.emulations.torch_expandable",
    "ascmem.raw_cann": "ascmem.emulations.raw_cann",
}


class _SameModule(importlib.abc.Loader):
    """Loads an old name by importing the new one and handing back that
    module object (the import system then files it under the old name
    too)."""

    def __init__(self, new_name):
        self.new_name = new_name

    def create_module(self, spec):
        return importlib.import_module(self.new_name)

    def exec_module(self, module):
        pass  # the module ran when its new name was imported


class _MovedFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path=None, target=None):
        new_name = MOVED.get(fullname)
        if new_name is None:
            return None
        return importlib.util.spec_from_loader(fullname, _SameModule(new_name))


def install():
    """Idempotent: one finder however often the package is reloaded."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.append(_MovedFinder())
