# The kernel's --config in `midas-nb run` (midas_nb.runs.kernel_arguments): drops its "without
# encryption" start warning, its shutdown-interrupt line and the traceback of a reply it could not
# send once the run (stopped by Ctrl-C) closed its sockets. Package data, not a module of midas_nb.
import logging


class _BatchRunNoise(logging.Filter):
    def filter(self, record):
        text = record.getMessage()
        if record.exc_info and type(record.exc_info[1]).__module__.startswith("zmq"):
            return False
        return "without encryption" not in text and not text.startswith("KeyboardInterrupt caught in kernel")


logging.getLogger("IPKernelApp").addFilter(_BatchRunNoise())
