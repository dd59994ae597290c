"""The network side of the data flow: a checked tree becomes torch modules and goes back and forth
to plain PyTorch. The only part of einspace, with the torch side of `ops/` and `testing/`, that
imports torch.

`compiler` builds the backbone and the classification head; `lowering` replaces runs of the
paper's fundamental operations with fast kernels; `export` writes a compiled network as one
readable PyTorch file; `importer` reads a PyTorch model back as a derivation tree. Import the
modules themselves (`einspace.network.compiler`): this package imports nothing, so that a
program that only exports does not build the importer.
"""
