"""Training drafters on the machine the model runs on: ``make-data`` then ``train-draft``.

``make_data`` (make_data.py) has the target answer prompts and saves its hidden states;
``train_draft`` (loop.py) trains an EAGLE-3, EAGLE, Medusa or MTP drafter on them and
writes it in the method's public layout.
"""
