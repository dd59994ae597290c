"""Import a PyTorch model, traced with torch.fx, as a derivation tree that computes the same function.

`graph` reads the traced model (values, dominators, source lines), `converter` turns it into the
grammar's modules; see `converter`'s docstring for how.
"""

from einspace.network.importer.converter import ImportedModel, import_model, load_factory
from einspace.network.importer.graph import ModelImportError

__all__ = ["ImportedModel", "ModelImportError", "import_model", "load_factory"]
