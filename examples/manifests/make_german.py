"""Rebuilds the German example manifest next to this file: four short utterances
synthesized with the project's eSpeak NG wrapper (`asr_grpo.data.espeak`), written as
16 kHz mono 16-bit WAVs under `de/`, and `de.jsonl` in NeMo style
(`audio_filepath` relative to the manifest's folder, `text`, `duration`, `lang`).

    python examples/manifests/make_german.py

The same calls in a fresh process give the same samples, so the committed files are
what this script writes.
"""
import json
from pathlib import Path

import soundfile as sf

from asr_grpo.data.espeak import EspeakSynthesizer

HERE = Path(__file__).resolve().parent
SAMPLE_RATE = 16000
UTTERANCES = [   # (text, eSpeak NG voice)
    ("Guten Morgen, wie geht es?", "de"),
    ("Wie spät ist es jetzt?", "de+f3"),
    ("Das Wetter ist heute schön.", "de+m3"),
    ("Grüße aus München.", "de+f2"),
]


def main() -> None:
    synth = EspeakSynthesizer()
    (HERE / "de").mkdir(exist_ok=True)
    lines = []
    for i, (text, voice) in enumerate(UTTERANCES, start=1):
        audio = synth.synthesize(text, voice, rate_wpm=160, sample_rate=SAMPLE_RATE, seed=i)
        rel = f"de/{i:04d}.wav"
        sf.write(HERE / rel, audio, SAMPLE_RATE, subtype="PCM_16")
        lines.append({"audio_filepath": rel, "text": text,
                      "duration": round(len(audio) / SAMPLE_RATE, 3), "lang": "de"})
    with open(HERE / "de.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(line, ensure_ascii=False) + "\n" for line in lines)


if __name__ == "__main__":
    main()
