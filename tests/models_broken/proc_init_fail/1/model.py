"""initialize() fails, so the model never becomes ready."""


class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("init_fail cannot start")

    def execute(self, requests):
        return []
