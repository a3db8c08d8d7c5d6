"""Features for learned routing policies: a static text embedding plus cheap conversation
statistics, combined into one versioned float32 vector. numpy + tokenizers only."""

from router.features.cheap import CHEAP_FEATURE_NAMES, CHEAP_FEATURES_VERSION, cheap_features
from router.features.embedding import EmbeddingAssetError, StaticEmbedding, default_embedding_dir
from router.features.extractor import FeatureConfig, FeatureExtractor

__all__ = [
    "CHEAP_FEATURES_VERSION",
    "CHEAP_FEATURE_NAMES",
    "EmbeddingAssetError",
    "FeatureConfig",
    "FeatureExtractor",
    "StaticEmbedding",
    "cheap_features",
    "default_embedding_dir",
]
