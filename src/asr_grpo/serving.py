"""The MLflow pyfunc face of a checkpoint: `mlflow.pyfunc.load_model(uri).predict(...)`
transcribes audio files with the registered model (greedy decoding).

`compare` saves the best run's HF checkpoint through `save_transcriber` and registers
it; the HF folder itself travels inside the MLflow model as the artifact `hf`, so
`transformers`' `from_pretrained` still loads it directly.
"""
from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc

ARTIFACT = "hf"
REQUIREMENTS = ["asr-grpo", "torch", "transformers", "soundfile", "mlflow"]


class Transcriber(mlflow.pyfunc.PythonModel):
    """predict(rows): rows with `audio_filepath` (and optional `language`, default `en`),
    as a pandas DataFrame or a list of dicts; returns one transcript per row."""

    def load_context(self, context) -> None:
        from asr_grpo.models import load_model

        self.model, self.processor = load_model(context.artifacts[ARTIFACT])
        self.model.eval()

    def predict(self, context, model_input, params=None) -> list[str]:
        from asr_grpo.data.audio import load_audio
        from asr_grpo.evaluation import transcribe

        rows = model_input.to_dict("records") if hasattr(model_input, "to_dict") else list(model_input)
        audios = [load_audio(r["audio_filepath"]) for r in rows]
        languages = [r.get("language") or "en" for r in rows]
        return transcribe(self.model, self.processor, audios, languages, **(params or {}))


def save_transcriber(hf_dir: str | Path, path: str | Path) -> Path:
    """An MLflow model folder at `path` holding `hf_dir` (MLmodel, the pyfunc, the weights)."""
    mlflow.pyfunc.save_model(str(path), python_model=Transcriber(), artifacts={ARTIFACT: str(hf_dir)},
                             pip_requirements=REQUIREMENTS)
    return Path(path)
