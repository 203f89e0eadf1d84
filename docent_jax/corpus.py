"""The entity corpus every DocEnt data source yields (SQuAD articles, Amazon movies)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class EntityData:
    """Entities, their training sentences and held-out entity-seeking queries.

    Attributes:
      entity_ids: ``[num_entities]`` stable keys (row i of the table is entity_ids[i]).
      entity_names: ``[num_entities]`` display names.
      sentences: ``(entity_index, sentence)`` training documents.
      queries: ``(query_text, relevant_entity_indices)`` evaluation queries.
      description: one line saying where the data came from and how it was split.
    """

    entity_ids: list[str]
    entity_names: list[str]
    sentences: list[tuple[int, str]]
    queries: list[tuple[str, tuple[int, ...]]]
    description: str

    @property
    def num_entities(self) -> int:
        return len(self.entity_ids)
