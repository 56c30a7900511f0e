"""The ASR engine: model loading and pinning, offline weight import, speculative decoding, benchmark."""
