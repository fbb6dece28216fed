"""DP fine-tuning of a local GGUF language model: a LoRA adapter trained with DP-Adam, then used as a generator.

The package receives texts from the data holder and never loads data itself. Its only output
that depends on private data is the adapter (and Adam's moments in checkpoints), both produced
by Opacus' clipped and noised gradients, so they are covered by the DP-SGD accounting of the
caller (Poisson-subsampled Gaussian, `TrainSettings.steps` releases at rate `sampling_rate`).

    model.py      load the base model, add LoRA, the adapter as a flat vector
    examples.py   a labelled example as a training sequence (control prompt + text + eos) and its loss
    dp_adam.py    Poisson-sampled DP-Adam with per-example clipping, resumable
    generator.py  the merged model as a dpsynth Generator
"""
