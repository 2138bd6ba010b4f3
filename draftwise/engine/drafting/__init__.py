"""Why a sequence gets N drafts: the draft decision, in one place.

Each step ``Speculator.propose`` (``speculator.py``) builds a ``DraftPlan`` (``plan.py``): every
sequence starts at ``num_speculative_tokens``, and each limit, in the order ``plan.py`` lists,
can only lower it; the last one that did is the sequence's reason, counted in the metrics. The
limits come from the request and the model (``max_tokens``, ``max_model_len``, the request's own
count), the batch (``speculative_config``'s batch-size limits, ``spec_decode/batch_limits.py``),
the price of verify rows (``length.py``: acceptance per position against ``step_cost.py``'s
measured step time by rows and keys), the KV blocks the drafter can get, and then what the
proposer actually drafted.
"""
