/* commlib C API: the only interface the cffi binding sees.
 *
 * Plain C types only; no Python inside. Every function that can fail returns
 * a status code (COMMLIB_OK on success); the message of the last failure on
 * the calling thread is available through commlib_last_error().
 *
 * This header is also parsed by cffi's cdef(), so it must stay free of
 * preprocessor conditionals other than the include guard and extern "C".
 */
#ifndef COMMLIB_C_API_H
#define COMMLIB_C_API_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Status codes. */
enum {
  COMMLIB_OK = 0,
  COMMLIB_ERR_VALUE = 1,        /* bad argument value      -> ValueError  */
  COMMLIB_ERR_TYPE = 2,         /* unsupported dtype / op  -> TypeError   */
  COMMLIB_ERR_MISMATCH = 3,     /* ranks disagree          -> CollectiveMismatchError */
  COMMLIB_ERR_NOT_INIT = 4,     /* not initialised / shut down */
  COMMLIB_ERR_PEER_LOST = 5,    /* a rank of the job died  */
  COMMLIB_ERR_INTERNAL = 6,     /* MPI or internal failure */
  COMMLIB_ERR_TIMEOUT = 7,      /* wait timed out (handle still pending) */
  COMMLIB_ERR_TIMED_OUT = 8     /* the request failed: its peers never took part within COMMLIB_TIMEOUT */
};

/* Operation types. */
enum {
  COMMLIB_OP_ALLREDUCE = 0,
  COMMLIB_OP_ALLGATHER = 1,
  COMMLIB_OP_BROADCAST = 2,
  COMMLIB_OP_ALLTOALL = 3,
  COMMLIB_OP_REDUCESCATTER = 4,
  COMMLIB_OP_BARRIER = 5,
  /* Internal: registering and removing process sets (negotiated on all ranks). */
  COMMLIB_OP_ADD_PROCESS_SET = 6,
  COMMLIB_OP_REMOVE_PROCESS_SET = 7,
  /* Point-to-point (never negotiated: matched by source, tag and set). */
  COMMLIB_OP_SEND = 8,
  COMMLIB_OP_RECV = 9,
  /* join: this rank has no more collectives to submit; until every rank has
     joined, it takes part in the others' collectives of the job (contributing
     zeros to reductions, no rows to allgather/alltoall). The handle's splits
     hold {last rank to join}. Global process set only. */
  COMMLIB_OP_JOIN = 10,
  /* Internal: a rank's request failed its local checks; the other ranks'
     requests of that name fail at once instead of waiting for it. */
  COMMLIB_OP_ABORT = 11
};

/* Where a request's buffers live. */
enum {
  COMMLIB_DEVICE_CPU = 0,
  COMMLIB_DEVICE_CUDA = 1
};

/* Element types. */
enum {
  COMMLIB_UINT8 = 0,
  COMMLIB_INT8 = 1,
  COMMLIB_INT32 = 2,
  COMMLIB_INT64 = 3,
  COMMLIB_FLOAT16 = 4,
  COMMLIB_BFLOAT16 = 5,
  COMMLIB_FLOAT32 = 6,
  COMMLIB_FLOAT64 = 7,
  COMMLIB_BOOL = 8,
  COMMLIB_INT16 = 9,
  COMMLIB_UINT16 = 10,
  COMMLIB_UINT32 = 11,
  COMMLIB_UINT64 = 12
};

/* Reduction operators (Average is Sum with a 1/size postscale; Adasum is
 * the adaptive summation of Maleki et al., allreduce of floating-point
 * tensors only). */
enum {
  COMMLIB_SUM = 0,
  COMMLIB_AVERAGE = 1,
  COMMLIB_MIN = 2,
  COMMLIB_MAX = 3,
  COMMLIB_PRODUCT = 4,
  COMMLIB_ADASUM = 5
};

/* One collective request. The caller keeps input/output and the arrays alive
 * until the handle completes; the core copies name, shape and splits. */
typedef struct {
  int op_type;
  const char* name;
  int dtype;
  int ndim;
  const int64_t* shape;
  const void* input;      /* data to send (may equal output for in-place)   */
  void* output;           /* allreduce/broadcast: same shape as input;
                             reducescatter: this rank's slice of dim 0;
                             allgather/alltoall: NULL (the core allocates)    */
  int reduce_op;
  double prescale;
  double postscale;
  int root;               /* broadcast root rank                             */
  const int64_t* splits;  /* alltoall: rows sent to each rank (size entries);
                             reducescatter: rows each rank keeps (the same
                             on every rank; none: an even split)            */
  int nsplits;            /* 0 = equal splits                                */
  int process_set;        /* 0: every rank; else an id from add_process_set. The
                             ranks of a request are then the set's members,
                             numbered by their order in the set (splits, result
                             rows), except root, which stays a job rank.       */
  int peer;               /* send: destination; recv: source (job ranks)     */
  int64_t tag;            /* send/recv: matched with the peer's (>= 0)       */
  int device_type;        /* COMMLIB_DEVICE_*; zero-initialised = CPU        */
  int device_id;          /* the device's index (CUDA)                       */
  void* stream;           /* the stream the buffers are ready on (CUDA)      */
  int64_t output_rows;    /* allgather (CPU or CUDA; CPU: with output set)
                             and CUDA alltoall: dim-0 rows the caller
                             allocated in output, which must be the
                             negotiated result's. A CPU allgather with an
                             output writes there instead of a result the
                             core allocates; its input may be this rank's
                             own part of output (in place)                  */
  void** pieces;          /* CPU reducescatter: the input as npieces buffers
                             end to end, read in place (input must be NULL);
                             a NULL piece stands for that many zeros        */
  const int64_t* piece_elements;  /* elements of each piece (sum: the shape's) */
  int npieces;            /* 0: the input is `input`                         */
  int p2p_flags;          /* recv: COMMLIB_P2P_TAKES_DEVICE (below)          */
  int nmembers;           /* allreduce with member_dtypes set: a group of
                             nmembers tensors (none: the handle completes at
                             once) submitted as one unit with one handle, negotiated
                             as one request (validated member by member,
                             "<name>.<i>" in errors) and fused up to the
                             fusion threshold. Member i has member_dtypes[i],
                             member_ndims[i] dimensions taken in order from
                             shape, buffers member_inputs[i] and
                             member_outputs[i]; dtype, ndim, input and output
                             are not read                                    */
  const int32_t* member_dtypes;
  const int32_t* member_ndims;
  void* const* member_inputs;
  void* const* member_outputs;
} commlib_request;

/* Point-to-point on CUDA buffers (through NCCL). A send with device_type
 * CUDA sends device memory of device_id, once the work queued on `stream`
 * before it is done. A recv takes such a device message only when it is
 * submitted (through commlib_enqueue) with p2p_flags COMMLIB_P2P_TAKES_DEVICE
 * and the CUDA device_id and stream the message should land on: into output
 * when device_type is CUDA (output is then device memory; dtype and shape are
 * output's), else into device memory the core allocates (stream-ordered). A
 * host message into such a recv lands in output when that is host memory,
 * else in host memory the core allocates. commlib_handle_p2p_result says
 * where a completed recv's message went. A recv without the flag refuses a
 * device message (both ends fail, saying why). */
enum { COMMLIB_P2P_TAKES_DEVICE = 1 };
/* 0: into the recv's output (or nothing to move); 1: host memory the core
 * allocated (dtype and shape: commlib_handle_recv_info); 2: device memory the
 * core allocated, at *device_ptr, to be handed back with
 * commlib_device_release. */
int commlib_handle_p2p_result(int64_t handle, void** device_ptr);
/* Queues on `stream` (of `device`) a device-to-device copy of bytes from src
 * (device memory of commlib_handle_p2p_result) to dst (none when dst is
 * NULL), then src's release. */
int commlib_device_release(void* src, void* dst, int64_t bytes, int device, void* stream);

/* Lifecycle. comm_handle is an MPI_Comm handle value (from mpi4py's
 * MPI._handleof) when has_comm != 0, else MPI_COMM_WORLD is used. */
int commlib_init(int64_t comm_handle, int has_comm);
int commlib_shutdown(void);
int commlib_is_initialized(void);
/* Non-zero (COMMLIB_ERR_PEER_LOST / COMMLIB_ERR_INTERNAL) once communication
 * is broken for good, or COMMLIB_ERR_TIMED_OUT when a request of this rank
 * timed out and no collective of the whole job completed since: MPI must then
 * be aborted rather than finalized (MPI_Finalize would wait for a frozen rank). */
int commlib_broken(void);
const char* commlib_last_error(void);

int commlib_rank(void);
int commlib_size(void);
int commlib_local_rank(void);
int commlib_local_size(void);
int commlib_cross_rank(void);
int commlib_cross_size(void);

/* Requests and handles. One entry submits every request: a collective, a
 * group of allreduces (member_dtypes set, see commlib_request), a point-to-point
 * send or recv. Returns the handle id (> 0), or minus the error code (the
 * message: commlib_last_error()). The core copies what it keeps (name,
 * shape, splits, member arrays): the struct may be reused at once.
 *
 * Point-to-point. send: data of dtype/shape to job rank peer. recv: from job
 * rank peer into output (dtype/shape: output's; the message must have that
 * dtype and element count), or with output NULL and dtype -1 into a buffer
 * the core allocates (commlib_handle_take_result; dtype and shape from
 * commlib_handle_recv_info). Matched by (peer, tag, process set), in the
 * order sent per pair and tag; a send completes once the receiver took its
 * data. */
int64_t commlib_submit(const commlib_request* req);
/* A send or recv run to completion by the calling thread (a blocking send,
 * or a recv into output): 0 when it finished within timeout_s (nothing to
 * release), minus the error code when it failed, else the still pending
 * request's handle (> 0; synchronize it as usual). */
int64_t commlib_p2p_blocking(const commlib_request* req, double timeout_s);
/* A collective this rank refused before submitting it (its frontend found
 * the arguments bad): the other members of req's process set that wait for
 * req's name, or submit it next, fail at once with CollectiveMismatchError
 * naming this rank and why; each rank's next call of that name pairs with
 * the others' next one. Nothing is sent while that name is in flight on this
 * rank, for a set this rank is not in, or before init (then 0 all the same). */
int commlib_abort(const commlib_request* req, const char* why);
/* A completed recv's message: dtype, ndim and up to max_ndim dimensions. */
int commlib_handle_recv_info(int64_t handle, int* dtype, int* ndim, int64_t* shape, int max_ndim);

/* Process sets. Collective over every rank of the job, in the same order on
 * every rank: add registers the n ranks (ascending, distinct) as a new set and
 * its handle's value (commlib_handle_value) is the set's id; remove ends set
 * id. Ranks that pass different lists (or ids) get CollectiveMismatchError. */
int commlib_add_process_set(const int32_t* ranks, int n, int64_t* handle);
int commlib_remove_process_set(int id, int64_t* handle);
/* The value of a completed handle (add_process_set: the new id). */
int commlib_handle_value(int64_t handle, int64_t* value);
/* 1 when the handle has completed (successfully or not), 0 when pending. */
int commlib_poll(int64_t handle);
/* Waits up to timeout_s seconds (negative: forever): COMMLIB_ERR_TIMEOUT
 * while the handle is pending, then its status (COMMLIB_OK or an error code
 * whose message is commlib_last_error()); with release != 0 a completed
 * handle is released in the same call (a synchronize that needs nothing else
 * from the core). */
int commlib_wait_status(int64_t handle, double timeout_s, int release);
/* A CUDA collective's synchronize on the caller's stream: waits (as
 * commlib_wait_status: COMMLIB_ERR_TIMEOUT while neither) until the handle
 * completed or was launched on the device. Launched and not complete: makes
 * `stream` (the caller's cudaStream_t; NULL: the legacy default stream) wait
 * on the device for its completion, sets *on_stream = 1 and lets go of the
 * handle, which the core releases when it completes; a failure after that is
 * returned, once, by the next wait of any handle. Otherwise *on_stream = 0,
 * and the status is returned and the handle released as by
 * commlib_wait_status with release. */
int commlib_wait_on_stream(int64_t handle, void* stream, double timeout_s, int* on_stream);
/* Result of an allgather/alltoall: pointer, bytes and dim 0 rows. Ownership
 * passes to the caller, who releases it with commlib_free_result(). */
int commlib_handle_take_result(int64_t handle, void** data, int64_t* nbytes,
                               int64_t* rows);
void commlib_free_result(void* data);
/* commlib_wait_status and commlib_handle_take_result in one call: waits up to
 * timeout_s (COMMLIB_ERR_TIMEOUT while pending); once the handle completed
 * without error, its result's pointer, bytes and rows go into info[0..2]
 * (ownership passes as by commlib_handle_take_result). With release != 0
 * the completed handle is released, whatever its status. */
int commlib_wait_result(int64_t handle, double timeout_s, int release, int64_t* info);
/* Rows received from each rank (alltoall) or contributed by each rank
 * (allgather); out must hold size() entries. */
int commlib_handle_splits(int64_t handle, int64_t* out);
int commlib_release(int64_t handle);

/* Configuration and introspection. */
/* Asks rank 0 to change the fusion threshold on every rank (any rank may
 * call it; calls are applied in the order rank 0 receives them, by every rank
 * at the same point of its sequence of collectives, so fused windows stay
 * alike). Until then commlib_fusion_threshold() returns the old value. Before
 * init it only sets this rank's value, which init replaces with
 * COMMLIB_FUSION_THRESHOLD. */
int commlib_set_fusion_threshold(int64_t bytes);
int64_t commlib_fusion_threshold(void);
/* The settings applied since init (autotune's, commlib_set_fusion_threshold's),
 * 5 words each: collectives this rank ran before, fusion threshold bytes,
 * cycle time us, tree/ring cutoff bytes, who (0 a call, 1 an autotune trial,
 * 2 autotune's final choice). Copies at most max_rows rows into out; returns
 * how many there are. */
int64_t commlib_tune_history(int64_t* out, int64_t max_rows);
/* Response cache counters of this rank since init: out[0] hits, out[1]
 * misses, out[2] invalidations, out[3] cached requests executed. */
void commlib_cache_stats(int64_t* out);
/* One line on where this rank's engine is (open, held and launched
 * requests; a cycle that has run for long, with the steps it is in, such as
 * "ncclCommInitRank"), readable while the engine is stuck; valid until this
 * thread's next call. commlibrun --timeout prints it for each rank. */
const char* commlib_engine_state(void);

/* The timeline (a Chrome-trace JSON file per rank; README "Timeline"): starts
 * writing to path (rank 0; rank r writes <stem>.rank<r><ext>), with a marker
 * per busy background cycle when mark_cycles != 0. COMMLIB_ERR_NOT_INIT
 * before init; COMMLIB_ERR_VALUE when the file cannot be created or a
 * timeline is already on. Stop flushes and closes it (no-op when off);
 * shutdown stops it too. */
int commlib_start_timeline(const char* path, int mark_cycles);
int commlib_stop_timeline(void);
const char* commlib_mpi_library_version(void);

/* GPU libraries, loaded at run time (README "GPU"). Loads NCCL and the CUDA
 * runtime once per process (an unusable result is retried by the next call):
 * nccl_library is COMMLIB_NCCL_LIBRARY's value (nothing else is tried when it
 * is not empty), wheel_library the nvidia-nccl-cu* wheel's libnccl.so.2 (or
 * ""), tried before the system's libnccl.so.2. Always COMMLIB_OK; what was
 * found is commlib_gpu_library()'s. */
int commlib_gpu_load(const char* nccl_library, const char* wheel_library);
/* What the last load found for which = 0 (NCCL) or 1 (CUDA runtime): 1 when
 * usable, 0 when not, -1 before any load. *version: ncclGetVersion's code or
 * cudaRuntimeGetVersion's; *path: where it was loaded from; *error: why it
 * is not usable ("" when it is). Static strings until the next load. */
int commlib_gpu_library(int which, int* version, const char** path, const char** error);
/* rank 0 of process_set makes an NCCL unique id (128 bytes) and every member
 * receives it into out over MPI. Collective over the set's members, with no
 * collective of the set in flight (diagnostics and tests). */
int commlib_nccl_unique_id(int process_set, uint8_t* out);

/* The configuration table: the COMMLIB_* environment variables the core
 * reads at init (README "Configuration"). commlib_config_count() entries;
 * entry i's name, default (as text), accepted values and meaning are static
 * strings. COMMLIB_ERR_VALUE for i out of range. */
int commlib_config_count(void);
int commlib_config_entry(int i, const char** name, const char** default_value,
                         const char** accepted, const char** meaning);
/* Checks value as the value of variable name, as init would (no init
 * needed): COMMLIB_OK, or COMMLIB_ERR_VALUE with commlib_last_error()
 * "NAME='value': reason" (also for a name not in the table). */
int commlib_config_check(const char* name, const char* value);

#ifdef __cplusplus
}
#endif

#endif /* COMMLIB_C_API_H */
