"""The only code that knows an HF vision-language model: the policy wrapper, what differs between model families, LoRA, FSDP2, packing, attention and log-probs."""
