"""The descriptor pool that holds tritonfast's generated protobuf types.

Generated modules in this package register their descriptors here rather than in protobuf's
process-wide default pool, where tritonclient registers the same ``inference.*`` names; see
``scripts/gen_protos.py`` for why.
"""

from google.protobuf import descriptor_pool

POOL = descriptor_pool.DescriptorPool()
