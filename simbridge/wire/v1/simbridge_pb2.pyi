from google.protobuf import struct_pb2 as _struct_pb2
from google.rpc import status_pb2 as _status_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    DTYPE_UNSPECIFIED: _ClassVar[DType]
    FLOAT32: _ClassVar[DType]
    FLOAT64: _ClassVar[DType]
    FLOAT16: _ClassVar[DType]
    INT8: _ClassVar[DType]
    INT16: _ClassVar[DType]
    INT32: _ClassVar[DType]
    INT64: _ClassVar[DType]
    UINT8: _ClassVar[DType]
    UINT16: _ClassVar[DType]
    UINT32: _ClassVar[DType]
    UINT64: _ClassVar[DType]
    BOOL: _ClassVar[DType]

class ErrorReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_REASON_UNSPECIFIED: _ClassVar[ErrorReason]
    INVALID_REQUEST: _ClassVar[ErrorReason]
    INVALID_VALUE: _ClassVar[ErrorReason]
    SESSION_UNKNOWN: _ClassVar[ErrorReason]
    WRONG_SESSION: _ClassVar[ErrorReason]
    WRONG_SESSION_KIND: _ClassVar[ErrorReason]
    EPISODE_UNKNOWN: _ClassVar[ErrorReason]
    EPISODE_ENDED: _ClassVar[ErrorReason]
    EPISODE_EXISTS: _ClassVar[ErrorReason]
    TOO_MANY_EPISODES: _ClassVar[ErrorReason]
    MESSAGE_TOO_LARGE: _ClassVar[ErrorReason]
    QUEUE_FULL: _ClassVar[ErrorReason]
    ALREADY_APPLIED: _ClassVar[ErrorReason]
    CALL_IN_PROGRESS: _ClassVar[ErrorReason]
    SPACE_MISMATCH: _ClassVar[ErrorReason]
    SERVER_UNAVAILABLE: _ClassVar[ErrorReason]
    SERVER_FAILURE: _ClassVar[ErrorReason]
    POLICY_NOT_PORTABLE: _ClassVar[ErrorReason]
    AUTH_FAILED: _ClassVar[ErrorReason]
    NOT_SESSION_OWNER: _ClassVar[ErrorReason]
    TOO_MANY_CALLS: _ClassVar[ErrorReason]
    TOO_MANY_SESSIONS: _ClassVar[ErrorReason]
    ID_TOO_LONG: _ClassVar[ErrorReason]
    SPACE_TOO_LARGE: _ClassVar[ErrorReason]
    SEQ_REUSED: _ClassVar[ErrorReason]
    SEQ_OUT_OF_ORDER: _ClassVar[ErrorReason]
    UNDECODABLE: _ClassVar[ErrorReason]
    TRAINING_OVER: _ClassVar[ErrorReason]
DTYPE_UNSPECIFIED: DType
FLOAT32: DType
FLOAT64: DType
FLOAT16: DType
INT8: DType
INT16: DType
INT32: DType
INT64: DType
UINT8: DType
UINT16: DType
UINT32: DType
UINT64: DType
BOOL: DType
ERROR_REASON_UNSPECIFIED: ErrorReason
INVALID_REQUEST: ErrorReason
INVALID_VALUE: ErrorReason
SESSION_UNKNOWN: ErrorReason
WRONG_SESSION: ErrorReason
WRONG_SESSION_KIND: ErrorReason
EPISODE_UNKNOWN: ErrorReason
EPISODE_ENDED: ErrorReason
EPISODE_EXISTS: ErrorReason
TOO_MANY_EPISODES: ErrorReason
MESSAGE_TOO_LARGE: ErrorReason
QUEUE_FULL: ErrorReason
ALREADY_APPLIED: ErrorReason
CALL_IN_PROGRESS: ErrorReason
SPACE_MISMATCH: ErrorReason
SERVER_UNAVAILABLE: ErrorReason
SERVER_FAILURE: ErrorReason
POLICY_NOT_PORTABLE: ErrorReason
AUTH_FAILED: ErrorReason
NOT_SESSION_OWNER: ErrorReason
TOO_MANY_CALLS: ErrorReason
TOO_MANY_SESSIONS: ErrorReason
ID_TOO_LONG: ErrorReason
SPACE_TOO_LARGE: ErrorReason
SEQ_REUSED: ErrorReason
SEQ_OUT_OF_ORDER: ErrorReason
UNDECODABLE: ErrorReason
TRAINING_OVER: ErrorReason

class Tensor(_message.Message):
    __slots__ = ("dtype", "shape", "data")
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    dtype: DType
    shape: _containers.RepeatedScalarFieldContainer[int]
    data: bytes
    def __init__(self, dtype: _Optional[_Union[DType, str]] = ..., shape: _Optional[_Iterable[int]] = ..., data: _Optional[bytes] = ...) -> None: ...

class Value(_message.Message):
    __slots__ = ("tensor", "dict", "tuple")
    TENSOR_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    tensor: Tensor
    dict: ValueDict
    tuple: ValueTuple
    def __init__(self, tensor: _Optional[_Union[Tensor, _Mapping]] = ..., dict: _Optional[_Union[ValueDict, _Mapping]] = ..., tuple: _Optional[_Union[ValueTuple, _Mapping]] = ...) -> None: ...

class ValueDict(_message.Message):
    __slots__ = ("items",)
    class ItemsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: Value
        def __init__(self, key: _Optional[str] = ..., value: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.MessageMap[str, Value]
    def __init__(self, items: _Optional[_Mapping[str, Value]] = ...) -> None: ...

class ValueTuple(_message.Message):
    __slots__ = ("items",)
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[Value]
    def __init__(self, items: _Optional[_Iterable[_Union[Value, _Mapping]]] = ...) -> None: ...

class Space(_message.Message):
    __slots__ = ("box", "discrete", "multi_discrete", "multi_binary", "dict", "tuple")
    BOX_FIELD_NUMBER: _ClassVar[int]
    DISCRETE_FIELD_NUMBER: _ClassVar[int]
    MULTI_DISCRETE_FIELD_NUMBER: _ClassVar[int]
    MULTI_BINARY_FIELD_NUMBER: _ClassVar[int]
    DICT_FIELD_NUMBER: _ClassVar[int]
    TUPLE_FIELD_NUMBER: _ClassVar[int]
    box: BoxSpace
    discrete: DiscreteSpace
    multi_discrete: MultiDiscreteSpace
    multi_binary: MultiBinarySpace
    dict: DictSpace
    tuple: TupleSpace
    def __init__(self, box: _Optional[_Union[BoxSpace, _Mapping]] = ..., discrete: _Optional[_Union[DiscreteSpace, _Mapping]] = ..., multi_discrete: _Optional[_Union[MultiDiscreteSpace, _Mapping]] = ..., multi_binary: _Optional[_Union[MultiBinarySpace, _Mapping]] = ..., dict: _Optional[_Union[DictSpace, _Mapping]] = ..., tuple: _Optional[_Union[TupleSpace, _Mapping]] = ...) -> None: ...

class BoxSpace(_message.Message):
    __slots__ = ("low", "high")
    LOW_FIELD_NUMBER: _ClassVar[int]
    HIGH_FIELD_NUMBER: _ClassVar[int]
    low: Tensor
    high: Tensor
    def __init__(self, low: _Optional[_Union[Tensor, _Mapping]] = ..., high: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class DiscreteSpace(_message.Message):
    __slots__ = ("n", "start")
    N_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    n: int
    start: int
    def __init__(self, n: _Optional[int] = ..., start: _Optional[int] = ...) -> None: ...

class MultiDiscreteSpace(_message.Message):
    __slots__ = ("nvec", "start")
    NVEC_FIELD_NUMBER: _ClassVar[int]
    START_FIELD_NUMBER: _ClassVar[int]
    nvec: Tensor
    start: Tensor
    def __init__(self, nvec: _Optional[_Union[Tensor, _Mapping]] = ..., start: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class MultiBinarySpace(_message.Message):
    __slots__ = ("shape",)
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    shape: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, shape: _Optional[_Iterable[int]] = ...) -> None: ...

class DictSpace(_message.Message):
    __slots__ = ("spaces",)
    SPACES_FIELD_NUMBER: _ClassVar[int]
    spaces: _containers.RepeatedCompositeFieldContainer[NamedSpace]
    def __init__(self, spaces: _Optional[_Iterable[_Union[NamedSpace, _Mapping]]] = ...) -> None: ...

class NamedSpace(_message.Message):
    __slots__ = ("name", "space")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SPACE_FIELD_NUMBER: _ClassVar[int]
    name: str
    space: Space
    def __init__(self, name: _Optional[str] = ..., space: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...

class TupleSpace(_message.Message):
    __slots__ = ("spaces",)
    SPACES_FIELD_NUMBER: _ClassVar[int]
    spaces: _containers.RepeatedCompositeFieldContainer[Space]
    def __init__(self, spaces: _Optional[_Iterable[_Union[Space, _Mapping]]] = ...) -> None: ...

class RequestHeader(_message.Message):
    __slots__ = ("session_id", "seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    seq: int
    def __init__(self, session_id: _Optional[str] = ..., seq: _Optional[int] = ...) -> None: ...

class AgentSpec(_message.Message):
    __slots__ = ("agent_id", "observation_space", "action_space")
    AGENT_ID_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    agent_id: str
    observation_space: Space
    action_space: Space
    def __init__(self, agent_id: _Optional[str] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ...) -> None: ...

class CreateSessionRequest(_message.Message):
    __slots__ = ("client_name", "observation_space", "action_space", "agents", "resume_session_id", "num_slots", "slots_training_enabled", "slots_evaluation")
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    RESUME_SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_SLOTS_FIELD_NUMBER: _ClassVar[int]
    SLOTS_TRAINING_ENABLED_FIELD_NUMBER: _ClassVar[int]
    SLOTS_EVALUATION_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    observation_space: Space
    action_space: Space
    agents: _containers.RepeatedCompositeFieldContainer[AgentSpec]
    resume_session_id: str
    num_slots: int
    slots_training_enabled: bool
    slots_evaluation: bool
    def __init__(self, client_name: _Optional[str] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ..., agents: _Optional[_Iterable[_Union[AgentSpec, _Mapping]]] = ..., resume_session_id: _Optional[str] = ..., num_slots: _Optional[int] = ..., slots_training_enabled: _Optional[bool] = ..., slots_evaluation: _Optional[bool] = ...) -> None: ...

class ServerLimits(_message.Message):
    __slots__ = ("max_message_bytes", "max_rows_per_request", "max_open_episodes_per_session", "session_timeout_s", "reconnect_grace_s", "max_concurrent_calls", "max_calls_per_client", "max_calls_per_connection", "max_sessions_per_client", "max_id_bytes", "max_space_elements", "step_timeout_s", "max_client_state_bytes", "response_cache_bytes")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_ROWS_PER_REQUEST_FIELD_NUMBER: _ClassVar[int]
    MAX_OPEN_EPISODES_PER_SESSION_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    RECONNECT_GRACE_S_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENT_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_CALLS_PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    MAX_CALLS_PER_CONNECTION_FIELD_NUMBER: _ClassVar[int]
    MAX_SESSIONS_PER_CLIENT_FIELD_NUMBER: _ClassVar[int]
    MAX_ID_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_SPACE_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    STEP_TIMEOUT_S_FIELD_NUMBER: _ClassVar[int]
    MAX_CLIENT_STATE_BYTES_FIELD_NUMBER: _ClassVar[int]
    RESPONSE_CACHE_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_rows_per_request: int
    max_open_episodes_per_session: int
    session_timeout_s: float
    reconnect_grace_s: float
    max_concurrent_calls: int
    max_calls_per_client: int
    max_calls_per_connection: int
    max_sessions_per_client: int
    max_id_bytes: int
    max_space_elements: int
    step_timeout_s: float
    max_client_state_bytes: int
    response_cache_bytes: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_rows_per_request: _Optional[int] = ..., max_open_episodes_per_session: _Optional[int] = ..., session_timeout_s: _Optional[float] = ..., reconnect_grace_s: _Optional[float] = ..., max_concurrent_calls: _Optional[int] = ..., max_calls_per_client: _Optional[int] = ..., max_calls_per_connection: _Optional[int] = ..., max_sessions_per_client: _Optional[int] = ..., max_id_bytes: _Optional[int] = ..., max_space_elements: _Optional[int] = ..., step_timeout_s: _Optional[float] = ..., max_client_state_bytes: _Optional[int] = ..., response_cache_bytes: _Optional[int] = ...) -> None: ...

class CreateSessionResponse(_message.Message):
    __slots__ = ("session_id", "limits", "server_version", "resumed", "last_seq")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    RESUMED_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    limits: ServerLimits
    server_version: str
    resumed: bool
    last_seq: int
    def __init__(self, session_id: _Optional[str] = ..., limits: _Optional[_Union[ServerLimits, _Mapping]] = ..., server_version: _Optional[str] = ..., resumed: _Optional[bool] = ..., last_seq: _Optional[int] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ("header",)
    HEADER_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ("truncated_episode_ids",)
    TRUNCATED_EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    truncated_episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, truncated_episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class StartEpisodeRequest(_message.Message):
    __slots__ = ("header", "episode_ids", "count", "training_enabled", "evaluation")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    TRAINING_ENABLED_FIELD_NUMBER: _ClassVar[int]
    EVALUATION_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    count: int
    training_enabled: bool
    evaluation: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., episode_ids: _Optional[_Iterable[str]] = ..., count: _Optional[int] = ..., training_enabled: _Optional[bool] = ..., evaluation: _Optional[bool] = ...) -> None: ...

class StartEpisodeResponse(_message.Message):
    __slots__ = ("episode_ids",)
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AgentRows(_message.Message):
    __slots__ = ("episode_ids", "agent_ids", "observations")
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    observations: Value
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ..., agent_ids: _Optional[_Iterable[str]] = ..., observations: _Optional[_Union[Value, _Mapping]] = ...) -> None: ...

class GetActionRequest(_message.Message):
    __slots__ = ("header", "rows", "rewards")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    rows: _containers.RepeatedCompositeFieldContainer[AgentRows]
    rewards: _containers.RepeatedCompositeFieldContainer[RewardRows]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., rows: _Optional[_Iterable[_Union[AgentRows, _Mapping]]] = ..., rewards: _Optional[_Iterable[_Union[RewardRows, _Mapping]]] = ...) -> None: ...

class ActionRows(_message.Message):
    __slots__ = ("actions", "policy_versions", "policy_ids")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_IDS_FIELD_NUMBER: _ClassVar[int]
    actions: Value
    policy_versions: _containers.RepeatedScalarFieldContainer[int]
    policy_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, actions: _Optional[_Union[Value, _Mapping]] = ..., policy_versions: _Optional[_Iterable[int]] = ..., policy_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GetActionResponse(_message.Message):
    __slots__ = ("actions",)
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    actions: _containers.RepeatedCompositeFieldContainer[ActionRows]
    def __init__(self, actions: _Optional[_Iterable[_Union[ActionRows, _Mapping]]] = ...) -> None: ...

class LogActionRequest(_message.Message):
    __slots__ = ("header", "rows", "actions", "rewards")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    rows: _containers.RepeatedCompositeFieldContainer[AgentRows]
    actions: _containers.RepeatedCompositeFieldContainer[Value]
    rewards: _containers.RepeatedCompositeFieldContainer[RewardRows]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., rows: _Optional[_Iterable[_Union[AgentRows, _Mapping]]] = ..., actions: _Optional[_Iterable[_Union[Value, _Mapping]]] = ..., rewards: _Optional[_Iterable[_Union[RewardRows, _Mapping]]] = ...) -> None: ...

class LogActionResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class RewardRows(_message.Message):
    __slots__ = ("episode_ids", "agent_ids", "rewards", "terminated", "truncated", "final_observations", "infos")
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    AGENT_IDS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    INFOS_FIELD_NUMBER: _ClassVar[int]
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    agent_ids: _containers.RepeatedScalarFieldContainer[str]
    rewards: Tensor
    terminated: _containers.RepeatedScalarFieldContainer[bool]
    truncated: _containers.RepeatedScalarFieldContainer[bool]
    final_observations: Value
    infos: _containers.RepeatedCompositeFieldContainer[_struct_pb2.Struct]
    def __init__(self, episode_ids: _Optional[_Iterable[str]] = ..., agent_ids: _Optional[_Iterable[str]] = ..., rewards: _Optional[_Union[Tensor, _Mapping]] = ..., terminated: _Optional[_Iterable[bool]] = ..., truncated: _Optional[_Iterable[bool]] = ..., final_observations: _Optional[_Union[Value, _Mapping]] = ..., infos: _Optional[_Iterable[_Union[_struct_pb2.Struct, _Mapping]]] = ...) -> None: ...

class EpisodeMetrics(_message.Message):
    __slots__ = ("episode_id", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    values: _containers.ScalarMap[str, float]
    def __init__(self, episode_id: _Optional[str] = ..., values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class LogReturnsRequest(_message.Message):
    __slots__ = ("header", "rows", "custom_metrics")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_METRICS_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    rows: _containers.RepeatedCompositeFieldContainer[RewardRows]
    custom_metrics: _containers.RepeatedCompositeFieldContainer[EpisodeMetrics]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., rows: _Optional[_Iterable[_Union[RewardRows, _Mapping]]] = ..., custom_metrics: _Optional[_Iterable[_Union[EpisodeMetrics, _Mapping]]] = ...) -> None: ...

class LogReturnsResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class EndEpisodeRequest(_message.Message):
    __slots__ = ("header", "episode_ids", "final_observations", "truncated", "rewards", "start_episode_ids", "start_training_enabled", "start_evaluation", "stopping")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    START_EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    START_TRAINING_ENABLED_FIELD_NUMBER: _ClassVar[int]
    START_EVALUATION_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    final_observations: _containers.RepeatedCompositeFieldContainer[AgentRows]
    truncated: _containers.RepeatedScalarFieldContainer[bool]
    rewards: _containers.RepeatedCompositeFieldContainer[RewardRows]
    start_episode_ids: _containers.RepeatedScalarFieldContainer[str]
    start_training_enabled: bool
    start_evaluation: bool
    stopping: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., episode_ids: _Optional[_Iterable[str]] = ..., final_observations: _Optional[_Iterable[_Union[AgentRows, _Mapping]]] = ..., truncated: _Optional[_Iterable[bool]] = ..., rewards: _Optional[_Iterable[_Union[RewardRows, _Mapping]]] = ..., start_episode_ids: _Optional[_Iterable[str]] = ..., start_training_enabled: _Optional[bool] = ..., start_evaluation: _Optional[bool] = ..., stopping: _Optional[bool] = ...) -> None: ...

class EndEpisodeResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class StepRequest(_message.Message):
    __slots__ = ("header", "observations", "rewards", "terminated", "truncated", "final_observations", "final")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    FINAL_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    observations: Value
    rewards: Tensor
    terminated: Tensor
    truncated: Tensor
    final_observations: Value
    final: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., observations: _Optional[_Union[Value, _Mapping]] = ..., rewards: _Optional[_Union[Tensor, _Mapping]] = ..., terminated: _Optional[_Union[Tensor, _Mapping]] = ..., truncated: _Optional[_Union[Tensor, _Mapping]] = ..., final_observations: _Optional[_Union[Value, _Mapping]] = ..., final: _Optional[bool] = ...) -> None: ...

class StepResponse(_message.Message):
    __slots__ = ("actions", "policy_versions", "policy_id")
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    actions: Value
    policy_versions: Tensor
    policy_id: str
    def __init__(self, actions: _Optional[_Union[Value, _Mapping]] = ..., policy_versions: _Optional[_Union[Tensor, _Mapping]] = ..., policy_id: _Optional[str] = ...) -> None: ...

class PortablePolicy(_message.Message):
    __slots__ = ("policy_id", "version", "observation_space", "action_space", "preprocessor", "layers", "head", "onnx_model")
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OBSERVATION_SPACE_FIELD_NUMBER: _ClassVar[int]
    ACTION_SPACE_FIELD_NUMBER: _ClassVar[int]
    PREPROCESSOR_FIELD_NUMBER: _ClassVar[int]
    LAYERS_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    ONNX_MODEL_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    version: int
    observation_space: Space
    action_space: Space
    preprocessor: str
    layers: _containers.RepeatedCompositeFieldContainer[Layer]
    head: ActionHead
    onnx_model: bytes
    def __init__(self, policy_id: _Optional[str] = ..., version: _Optional[int] = ..., observation_space: _Optional[_Union[Space, _Mapping]] = ..., action_space: _Optional[_Union[Space, _Mapping]] = ..., preprocessor: _Optional[str] = ..., layers: _Optional[_Iterable[_Union[Layer, _Mapping]]] = ..., head: _Optional[_Union[ActionHead, _Mapping]] = ..., onnx_model: _Optional[bytes] = ...) -> None: ...

class Layer(_message.Message):
    __slots__ = ("op", "weight", "bias")
    OP_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    BIAS_FIELD_NUMBER: _ClassVar[int]
    op: str
    weight: Tensor
    bias: Tensor
    def __init__(self, op: _Optional[str] = ..., weight: _Optional[_Union[Tensor, _Mapping]] = ..., bias: _Optional[_Union[Tensor, _Mapping]] = ...) -> None: ...

class ActionHead(_message.Message):
    __slots__ = ("kind", "branch_sizes", "params")
    class ParamsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    KIND_FIELD_NUMBER: _ClassVar[int]
    BRANCH_SIZES_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    kind: str
    branch_sizes: _containers.RepeatedScalarFieldContainer[int]
    params: _containers.ScalarMap[str, float]
    def __init__(self, kind: _Optional[str] = ..., branch_sizes: _Optional[_Iterable[int]] = ..., params: _Optional[_Mapping[str, float]] = ...) -> None: ...

class GetPolicyRequest(_message.Message):
    __slots__ = ("header", "known_version", "include_onnx")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    KNOWN_VERSION_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_ONNX_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    known_version: int
    include_onnx: bool
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., known_version: _Optional[int] = ..., include_onnx: _Optional[bool] = ...) -> None: ...

class GetPolicyResponse(_message.Message):
    __slots__ = ("unchanged", "policy")
    UNCHANGED_FIELD_NUMBER: _ClassVar[int]
    POLICY_FIELD_NUMBER: _ClassVar[int]
    unchanged: bool
    policy: PortablePolicy
    def __init__(self, unchanged: _Optional[bool] = ..., policy: _Optional[_Union[PortablePolicy, _Mapping]] = ...) -> None: ...

class UploadExperienceRequest(_message.Message):
    __slots__ = ("header", "episode_ids", "episode_index", "t", "observations", "actions", "rewards", "next_observations", "terminated", "truncated", "policy_versions", "action_logp", "finished_episodes")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    EPISODE_IDS_FIELD_NUMBER: _ClassVar[int]
    EPISODE_INDEX_FIELD_NUMBER: _ClassVar[int]
    T_FIELD_NUMBER: _ClassVar[int]
    OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    ACTIONS_FIELD_NUMBER: _ClassVar[int]
    REWARDS_FIELD_NUMBER: _ClassVar[int]
    NEXT_OBSERVATIONS_FIELD_NUMBER: _ClassVar[int]
    TERMINATED_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSIONS_FIELD_NUMBER: _ClassVar[int]
    ACTION_LOGP_FIELD_NUMBER: _ClassVar[int]
    FINISHED_EPISODES_FIELD_NUMBER: _ClassVar[int]
    header: RequestHeader
    episode_ids: _containers.RepeatedScalarFieldContainer[str]
    episode_index: Tensor
    t: Tensor
    observations: Value
    actions: Value
    rewards: Tensor
    next_observations: Value
    terminated: Tensor
    truncated: Tensor
    policy_versions: Tensor
    action_logp: Tensor
    finished_episodes: _containers.RepeatedCompositeFieldContainer[EpisodeSummary]
    def __init__(self, header: _Optional[_Union[RequestHeader, _Mapping]] = ..., episode_ids: _Optional[_Iterable[str]] = ..., episode_index: _Optional[_Union[Tensor, _Mapping]] = ..., t: _Optional[_Union[Tensor, _Mapping]] = ..., observations: _Optional[_Union[Value, _Mapping]] = ..., actions: _Optional[_Union[Value, _Mapping]] = ..., rewards: _Optional[_Union[Tensor, _Mapping]] = ..., next_observations: _Optional[_Union[Value, _Mapping]] = ..., terminated: _Optional[_Union[Tensor, _Mapping]] = ..., truncated: _Optional[_Union[Tensor, _Mapping]] = ..., policy_versions: _Optional[_Union[Tensor, _Mapping]] = ..., action_logp: _Optional[_Union[Tensor, _Mapping]] = ..., finished_episodes: _Optional[_Iterable[_Union[EpisodeSummary, _Mapping]]] = ...) -> None: ...

class EpisodeSummary(_message.Message):
    __slots__ = ("episode_id", "total_reward", "length", "truncated", "custom_metrics", "stopping")
    class CustomMetricsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    EPISODE_ID_FIELD_NUMBER: _ClassVar[int]
    TOTAL_REWARD_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    TRUNCATED_FIELD_NUMBER: _ClassVar[int]
    CUSTOM_METRICS_FIELD_NUMBER: _ClassVar[int]
    STOPPING_FIELD_NUMBER: _ClassVar[int]
    episode_id: str
    total_reward: float
    length: int
    truncated: bool
    custom_metrics: _containers.ScalarMap[str, float]
    stopping: bool
    def __init__(self, episode_id: _Optional[str] = ..., total_reward: _Optional[float] = ..., length: _Optional[int] = ..., truncated: _Optional[bool] = ..., custom_metrics: _Optional[_Mapping[str, float]] = ..., stopping: _Optional[bool] = ...) -> None: ...

class UploadExperienceResponse(_message.Message):
    __slots__ = ("accepted_steps", "policy_version")
    ACCEPTED_STEPS_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    accepted_steps: int
    policy_version: int
    def __init__(self, accepted_steps: _Optional[int] = ..., policy_version: _Optional[int] = ...) -> None: ...

class StreamRequest(_message.Message):
    __slots__ = ("create_session", "start_episode", "get_action", "log_action", "log_returns", "end_episode", "close_session", "step")
    CREATE_SESSION_FIELD_NUMBER: _ClassVar[int]
    START_EPISODE_FIELD_NUMBER: _ClassVar[int]
    GET_ACTION_FIELD_NUMBER: _ClassVar[int]
    LOG_ACTION_FIELD_NUMBER: _ClassVar[int]
    LOG_RETURNS_FIELD_NUMBER: _ClassVar[int]
    END_EPISODE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_SESSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    create_session: CreateSessionRequest
    start_episode: StartEpisodeRequest
    get_action: GetActionRequest
    log_action: LogActionRequest
    log_returns: LogReturnsRequest
    end_episode: EndEpisodeRequest
    close_session: CloseSessionRequest
    step: StepRequest
    def __init__(self, create_session: _Optional[_Union[CreateSessionRequest, _Mapping]] = ..., start_episode: _Optional[_Union[StartEpisodeRequest, _Mapping]] = ..., get_action: _Optional[_Union[GetActionRequest, _Mapping]] = ..., log_action: _Optional[_Union[LogActionRequest, _Mapping]] = ..., log_returns: _Optional[_Union[LogReturnsRequest, _Mapping]] = ..., end_episode: _Optional[_Union[EndEpisodeRequest, _Mapping]] = ..., close_session: _Optional[_Union[CloseSessionRequest, _Mapping]] = ..., step: _Optional[_Union[StepRequest, _Mapping]] = ...) -> None: ...

class StreamResponse(_message.Message):
    __slots__ = ("error", "create_session", "start_episode", "get_action", "log_action", "log_returns", "end_episode", "close_session", "step")
    ERROR_FIELD_NUMBER: _ClassVar[int]
    CREATE_SESSION_FIELD_NUMBER: _ClassVar[int]
    START_EPISODE_FIELD_NUMBER: _ClassVar[int]
    GET_ACTION_FIELD_NUMBER: _ClassVar[int]
    LOG_ACTION_FIELD_NUMBER: _ClassVar[int]
    LOG_RETURNS_FIELD_NUMBER: _ClassVar[int]
    END_EPISODE_FIELD_NUMBER: _ClassVar[int]
    CLOSE_SESSION_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    error: _status_pb2.Status
    create_session: CreateSessionResponse
    start_episode: StartEpisodeResponse
    get_action: GetActionResponse
    log_action: LogActionResponse
    log_returns: LogReturnsResponse
    end_episode: EndEpisodeResponse
    close_session: CloseSessionResponse
    step: StepResponse
    def __init__(self, error: _Optional[_Union[_status_pb2.Status, _Mapping]] = ..., create_session: _Optional[_Union[CreateSessionResponse, _Mapping]] = ..., start_episode: _Optional[_Union[StartEpisodeResponse, _Mapping]] = ..., get_action: _Optional[_Union[GetActionResponse, _Mapping]] = ..., log_action: _Optional[_Union[LogActionResponse, _Mapping]] = ..., log_returns: _Optional[_Union[LogReturnsResponse, _Mapping]] = ..., end_episode: _Optional[_Union[EndEpisodeResponse, _Mapping]] = ..., close_session: _Optional[_Union[CloseSessionResponse, _Mapping]] = ..., step: _Optional[_Union[StepResponse, _Mapping]] = ...) -> None: ...
