"""How a draft is verified: one concern per module, each named for it.

* ``config.py``: the user's keys (``additional_config["rejection_sampler_config"]``) and the rule
  they select, once, when the engine is configured;
* ``rules.py``: the rules for sampled drafts as objects (standard, lossless and cumulative block
  verify, each with optional entropy thresholds);
* ``formulas.py``: their tensor formulas (acceptance, residuals), no loops and no host sync;
* ``rejection_sampler.py``: verification of a step's drafts, chain or tree, to accepted drafts
  plus one target token per sequence;
* ``tree.py``: the walk down a draft tree (which drafts follow the target's own draw).

The model runner reaches them through ``sample.sample`` (``sampler.py``), the one entry point.
Nothing is imported here: ``metadata.py`` reads ``tree.py`` while ``rules.py`` reads
``metadata.py``.
"""
