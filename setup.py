"""sage-tfx: block-composition differential privacy for TFX pipelines."""
import setuptools

setuptools.setup(
    name="sage-tfx",
    version="0.1.0",
    description="Differentially private TFX pipelines under block-composition access control "
                "(Sage).",
    python_requires=">=3.10,<3.11",
    # The TFX components and runnable pipelines sit at the top of the repository but install as
    # sub-packages of sage_tfx, so `from sage_tfx.components import SageGate` works.
    package_dir={
        "sage_tfx": "sage_tfx",
        "sage_tfx.components": "components",
        "sage_tfx.pipelines": "pipelines",
    },
    packages=(
        ["sage_tfx"]
        + ["sage_tfx." + p for p in setuptools.find_packages("sage_tfx")]
        + ["sage_tfx.components"]
        + ["sage_tfx.components." + p for p in setuptools.find_packages("components")]
        + ["sage_tfx.pipelines"]
        + ["sage_tfx.pipelines." + p for p in setuptools.find_packages("pipelines")]
    ),
    package_data={"sage_tfx.pipelines": ["flights_schema/*.pbtxt", "taxi_schema/*.pbtxt"]},
    install_requires=[
        "dp-accounting==0.4.3",
        "numpy",
        "psycopg[binary]",
    ],
    entry_points={"console_scripts": ["sage-tfx=sage_tfx.cli:main"]},
)
