"""The contract: generated protobuf code, tensor and space codecs, the error model.

Imports nothing else of simbridge: a simulator, the server and the trainer all speak it.
"""
