"""Memory plumbing: client-registered shared memory (system and CUDA), the segments worker
processes share, buffer pools, the allocator's settings, and what a killed server leaves
behind. Imports nothing above :mod:`tritonfast.data`."""
