from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Trajectory(_message.Message):
    __slots__ = ("env_id", "task_id", "seed", "steps", "episode_id", "domain", "split", "terminated", "truncated", "success", "policy_id", "created_unix_ns", "metadata")
    class MetadataEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ENV_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    DOMAIN_FIELD_NUMBER: _ClassVar[int]
    SPLIT_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_NS_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    env_id: str
    task_id: str
    seed: int
    steps: _containers.RepeatedCompositeFieldContainer[Step]
    episode_id: str
    domain: str
    split: str
    terminated: bool
    truncated: bool
    success: bool
    policy_id: str
    created_unix_ns: int
    metadata: _containers.ScalarMap[str, str]
    def __init__(self, env_id: _Optional[str] = ..., task_id: _Optional[str] = ..., seed: _Optional[int] = ..., steps: _Optional[_Iterable[_Union[Step, _Mapping]]] = ..., episode_id: _Optional[str] = ..., domain: _Optional[str] = ..., split: _Optional[str] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., success: _Optional[bool] = ..., policy_id: _Optional[str] = ..., created_unix_ns: _Optional[int] = ..., metadata: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("prompt", "action", "observation", "observation_truncated", "reward", "reward_components", "log_prob", "value", "advantage", "embedding", "token_log_probs", "token_ids", "terminated", "truncated", "tool")
    class RewardComponentsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    ACTION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    REWARD_COMPONENTS_FIELD_NUMBER: _ClassVar[int]
    LOG_PROB_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ADVANTAGE_FIELD_NUMBER: _ClassVar[int]
    EMBEDDING_FIELD_NUMBER: _ClassVar[int]
    TOKEN_LOG_PROBS_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    prompt: str
    action: str
    observation: bytes
    observation_truncated: bool
    reward: float
    reward_components: _containers.ScalarMap[str, float]
    log_prob: float
    value: float
    advantage: float
    embedding: bytes
    token_log_probs: bytes
    token_ids: bytes
    terminated: bool
    truncated: bool
    tool: str
    def __init__(self, prompt: _Optional[str] = ..., action: _Optional[str] = ..., observation: _Optional[bytes] = ..., observation_truncated: _Optional[bool] = ..., reward: _Optional[float] = ..., reward_components: _Optional[_Mapping[str, float]] = ..., log_prob: _Optional[float] = ..., value: _Optional[float] = ..., advantage: _Optional[float] = ..., embedding: _Optional[bytes] = ..., token_log_probs: _Optional[bytes] = ..., token_ids: _Optional[bytes] = ..., terminated: _Optional[bool] = ..., truncated: _Optional[bool] = ..., tool: _Optional[str] = ...) -> None: ...
