"""Small language models pretrained on real text, one per attention rule (``sinklab pretrain``).

- ``sinklab.pretrain.data``: the corpora that install offline, byte tokens, the split and the
  training and validation windows;
- ``sinklab.pretrain.network``: the causal LM (rotary positions, pre-LayerNorm blocks with an MLP,
  any registered attention rule, sinklab's hooks);
- ``sinklab.pretrain.training``: one run's settings, training loop, measurements and resumption.
"""
