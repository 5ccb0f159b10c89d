"""Beam's own portable services, bound to 127.0.0.1, each run as a separate process.

``python beam_services.py job-service PORT_FILE`` runs Beam's Python job service
(``LocalJobServicer``: the Job API a Flink / Spark job server also speaks, executing pipelines
with the Fn API runner); ``python beam_services.py worker-pool PORT_FILE`` runs an external SDK
worker pool (``BeamFnExternalWorkerPoolServicer``, what ``--environment_type=EXTERNAL`` names;
each StartWorker call starts an SDK harness process). Each writes its port to PORT_FILE once it
listens, then serves until killed. Beam's ``*_main`` scripts bind all interfaces; these bind the
loopback only.
"""
import sys
import time


def job_service(port_file: str) -> None:
    from apache_beam.runners.portability import local_job_service

    class LoopbackJobServicer(local_job_service.LocalJobServicer):
        def get_service_address(self):
            return "127.0.0.1"

    port = LoopbackJobServicer().start_grpc_server(0)
    _announce(port_file, port)


def worker_pool(port_file: str) -> None:
    import grpc
    from apache_beam.portability.api import beam_fn_api_pb2_grpc
    from apache_beam.runners.worker import worker_pool_main
    from apache_beam.utils import thread_pool_executor

    server = grpc.server(thread_pool_executor.shared_unbounded_instance())
    port = server.add_insecure_port("127.0.0.1:0")
    beam_fn_api_pb2_grpc.add_BeamFnExternalWorkerPoolServicer_to_server(
        worker_pool_main.BeamFnExternalWorkerPoolServicer(use_process=True), server)
    server.start()
    _announce(port_file, port)


def _announce(port_file: str, port: int) -> None:
    with open(port_file + ".tmp", "w") as f:
        f.write(str(port))
    import os
    os.replace(port_file + ".tmp", port_file)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    {"job-service": job_service, "worker-pool": worker_pool}[sys.argv[1]](sys.argv[2])
