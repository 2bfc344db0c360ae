"""Never imported: the model's config names an unknown TRITONFAST_INSTANCE_MODE."""


class TritonPythonModel:
    def execute(self, requests):
        raise AssertionError("bad_mode must not load")
