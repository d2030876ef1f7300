"""The table2latex recipe: synthetic LaTeX tables rendered by the sandbox, and converters from the public
formats (PubTabNet, Table2LaTeX-RL pairs)."""
