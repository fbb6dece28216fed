"""The run engine: `config` (read/write run configs), `planning` (the privacy plan), `build`
(parts from config), `engine` (create/resume, the loop, checkpoints), `outputs` (artifacts)."""
