"""Meshes: one file describing every host and test of a mesh (RTPL's full mesh, perfSONAR's
pSConfig meshes), from which each host derives its own configuration."""

from iepm.mesh.load import LoadedMesh, MeshSource, derive, is_mesh, load_mesh, load_mesh_text
from iepm.mesh.model import Host, Mesh, Pair, Test

__all__ = [
    "Host",
    "LoadedMesh",
    "Mesh",
    "MeshSource",
    "Pair",
    "Test",
    "derive",
    "is_mesh",
    "load_mesh",
    "load_mesh_text",
]
