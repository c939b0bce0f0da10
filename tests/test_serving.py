"""The registered model loads back through MLflow's pyfunc and transcribes: the same
text as greedy decoding with the HF folder itself."""
from __future__ import annotations

import mlflow.pyfunc
import soundfile as sf
from helpers import noise_audio

from asr_grpo.evaluation import transcribe
from asr_grpo.models import save_hf_checkpoint
from asr_grpo.serving import save_transcriber


def test_the_pyfunc_transcribes_as_the_checkpoint_does(tmp_path, tiny_model, tiny_processor):
    hf = save_hf_checkpoint(tiny_model, tiny_processor, tmp_path / "hf")
    folder = save_transcriber(hf, tmp_path / "mlflow_model")
    assert (folder / "MLmodel").is_file()
    audios = [noise_audio(1.0, 0), noise_audio(1.5, 1)]
    rows = []
    for i, audio in enumerate(audios):
        sf.write(tmp_path / f"{i}.wav", audio, 16000)
        rows.append({"audio_filepath": str(tmp_path / f"{i}.wav"), "language": ["en", "zh"][i]})
    got = mlflow.pyfunc.load_model(str(folder)).predict(rows, params={"max_new_tokens": 8})
    want = transcribe(tiny_model, tiny_processor, audios, ["en", "zh"], max_new_tokens=8)
    assert got == want and len(got) == 2
