"""pyext's RuntimeModule, which veRL's prime_code imports: pyext 0.7 no longer installs on Python 3.11. Its
``from_string`` makes a module of that name and runs the source text in it, as here."""

import types


class RuntimeModule(types.ModuleType):
    @staticmethod
    def from_string(name, docstring, contents):
        module = RuntimeModule(name, docstring)
        exec(contents, module.__dict__)
        return module
