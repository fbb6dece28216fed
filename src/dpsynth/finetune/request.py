"""What a method asks the data holder to train: a public, serialisable description of one DP fine-tuning.

Everything here is public (model file, LoRA shape, the DP-SGD schedule, the control-code prompt of
each label); the holder adds the private records, the calibrated noise multiplier and a secret seed.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class AdapterTraining(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    model: str = Field(description="path of the local GGUF model whose LoRA adapter is trained")
    lora_r: int = Field(ge=1)
    lora_alpha: int = Field(ge=1)
    steps: int = Field(ge=1)
    sampling_rate: float = Field(gt=0.0, le=1.0,
                                 description="Poisson rate: each record (or person) joins each step with it")
    clip_norm: float = Field(gt=0.0)
    learning_rate: float = Field(gt=0.0)
    max_length: int = Field(ge=2, description="tokens per training sequence (prompt + text)")
    prompts: dict[str, str] = Field(description="label -> its control-code prompt (the text follows it)")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: torch's own choice)")
    rounds: int = Field(1, ge=1, description="federated: FedAvg rounds, each `steps` local DP steps at every "
                        "training party (central training: 1)")
    server_learning_rate: float = Field(1.0, gt=0.0, description="federated: the server adds this times the mean "
                                        "of the parties' updates to the adapter each round (1 = plain FedAvg)")
    parties: tuple[int, ...] | None = Field(None, description="federated: the ids of the parties that train")
    init_seed: int = Field(0, description="public seed of the LoRA initialisation the rounds start from")

    @property
    def total_steps(self) -> int:
        """DP steps each training record may take part in (the release's subsampled-Gaussian count)."""
        return self.rounds * self.steps
