"""Models: what a `--model` names (recipes, local folders, hub ids), its files and their
digests, its tokenizer's facts, the export cache, and the devices it runs on."""
