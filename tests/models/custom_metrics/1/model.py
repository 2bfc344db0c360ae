"""Custom metrics through pb_utils.MetricFamily (see config.pbtxt)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        labels = {"model": args["model_name"], "version": args["model_version"]}
        self.families = [
            pb_utils.MetricFamily(
                "tf_test_requests", "Requests seen by the model", pb_utils.MetricFamily.COUNTER
            ),
            pb_utils.MetricFamily(
                "tf_test_last_value", "The last value seen", pb_utils.MetricFamily.GAUGE
            ),
            pb_utils.MetricFamily("tf_test_values", "Values seen", pb_utils.MetricFamily.HISTOGRAM),
        ]
        counter, gauge, histogram = self.families
        self.requests = counter.Metric(labels=labels)
        self.last = gauge.Metric(labels=labels)
        self.values = histogram.Metric(labels=labels, buckets=[0.5, 1.0, 10.0])

    def execute(self, requests):
        responses = []
        for request in requests:
            tensor = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            value = float(tensor.as_numpy()[0])
            self.requests.increment(1)
            self.last.set(value)
            self.values.observe(value)
            # value(): over all the model's instances, whichever processes they run in
            seen = np.array([self.requests.value()], dtype=np.float32)
            responses.append(
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", tensor.as_numpy()), pb_utils.Tensor("SEEN", seen)]
                )
            )
        return responses
