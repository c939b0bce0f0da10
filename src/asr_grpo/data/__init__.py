"""Data: the synthetic eSpeak NG corpus, manifests, audio loading and the dataset."""
from asr_grpo.data.audio import AudioError, load_audio, resample
from asr_grpo.data.corpus import GENERATOR_VERSION, CorpusManifests, build_corpus, corpus_hash
from asr_grpo.data.espeak import EspeakError, EspeakSynthesizer
from asr_grpo.data.manifest import ManifestError, ManifestReadResult, Utterance, read_manifest

__all__ = [
    "AsrDataset", "AudioError", "CorpusManifests", "EspeakError", "EspeakSynthesizer",
    "GENERATOR_VERSION", "ManifestError", "ManifestReadResult", "Utterance", "build_corpus",
    "corpus_hash", "load_audio", "read_manifest", "resample", "resolve_manifests", "skipped_lines",
]


def __getattr__(name: str):
    # Imported on first use so that corpus worker processes never import torch.
    if name in ("AsrDataset", "resolve_manifests", "skipped_lines"):
        from asr_grpo.data import dataset
        return getattr(dataset, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
