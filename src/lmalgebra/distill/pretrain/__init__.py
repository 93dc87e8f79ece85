"""Teachers made here: pre-training a masked or causal LM from scratch, or fitting a masked-LM
head on a frozen encoder."""
