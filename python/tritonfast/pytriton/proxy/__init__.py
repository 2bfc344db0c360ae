"""PyTriton's ``pytriton.proxy`` names a program may import."""
