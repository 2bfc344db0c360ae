"""Fails every request by raising from execute()."""


class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("raiser always fails")
