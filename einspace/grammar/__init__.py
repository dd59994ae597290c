"""The grammar-file language: parse, validate, analyse."""

from einspace.grammar.model import Grammar
from einspace.grammar.parser import load_grammar, parse_grammar

__all__ = ["Grammar", "load_grammar", "parse_grammar"]
