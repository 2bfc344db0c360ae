"""tritonfast in an NVIDIA Dynamo deployment: a worker serving its models to Dynamo's
frontends and routers (:mod:`.worker`), in Dynamo's tensor messages (:mod:`.messages`)."""
